"""What the device is: name, SMs, L2, memory, driver, and its datasheet peak rates."""

from operatorx.platform.device import DeviceInfo, describe_device, resolve_device
from operatorx.platform.peaks import Peaks, compute_class, peaks_for

__all__ = ["DeviceInfo", "describe_device", "resolve_device", "Peaks", "peaks_for", "compute_class"]
