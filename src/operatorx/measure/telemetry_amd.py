"""AMD GPUs' conditions through amdsmi, behind the same interface as the NVML reader.

`available`, `sample()`, `energy_mj()`, `max_sm_clock_hz()` mean what they mean in telemetry.py,
so the sampler, the capped rule and the retry work unchanged. amdsmi's units moved between
releases (power in W or µW, temperature in °C or m°C); values are normalized by magnitude.
A non-zero `throttle_status` in the GPU metrics table is reported as the reason
`amd_throttle` (amdsmi does not say power or thermal there in a stable way), which the capped
rule treats like a power/thermal reason: it still needs a lower clock to call an attempt capped.
"""

from __future__ import annotations

import re
from typing import Any, Optional

__all__ = ["AmdTelemetry", "AMD_THROTTLE"]

AMD_THROTTLE = "amd_throttle"


def _watts(value: Any) -> Optional[float]:
    if not isinstance(value, (int, float)) or value < 0:
        return None
    return value / 1e6 if value > 100_000 else float(value)       # µW in some releases, W in others


def _mhz(value: Any) -> Optional[float]:
    """A clock in MHz, or None where amdsmi gives none ("N/A" for what a device does not report)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        return None
    return float(value)


def _celsius(value: Any) -> Optional[float]:
    if not isinstance(value, (int, float)):
        return None
    return value / 1000 if value > 1000 else float(value)         # m°C in older releases


def _bdf(text: Any) -> Optional[tuple[int, int, int, int]]:
    """A PCI address as numbers (domain, bus, device, function). The text differs by who writes it:
    torch's properties give an 8-digit domain (`00000000:c1:00.0`), amdsmi a 4-digit one
    (`0000:c1:00.0`); compared as text they never match and the reader falls back to the index,
    which HIP_VISIBLE_DEVICES reorders."""
    m = re.fullmatch(r"(?:([0-9a-f]+):)?([0-9a-f]+):([0-9a-f]+)\.([0-9a-f]+)", str(text or "").strip().lower())
    if m is None:
        return None
    return (int(m.group(1) or "0", 16), int(m.group(2), 16), int(m.group(3), 16), int(m.group(4), 16))


def _device_bdf(smi: Any, handle: Any) -> Any:
    try:
        return smi.amdsmi_get_gpu_device_bdf(handle)
    except Exception:  # noqa: BLE001 - a handle without an address matches nothing
        return None


class AmdTelemetry:
    def __init__(self, device_index: Optional[int] = 0, pci_bus_id: Optional[str] = None, module: Any = None):
        """`module` is amdsmi (tests pass a fake); None imports it. Nothing here raises: without
        amdsmi or a device the reader is simply not `available`."""
        self._smi: Any = None
        self._handle: Any = None
        if device_index is None:
            return
        try:
            smi = module
            if smi is None:
                import amdsmi

                smi = amdsmi
            smi.amdsmi_init()
            handles = smi.amdsmi_get_processor_handles()
            handle = handles[device_index]
            wanted = _bdf(pci_bus_id)
            if wanted is not None:
                matching = [h for h in handles if _bdf(_device_bdf(smi, h)) == wanted]
                handle = matching[0] if matching else handle
            self._smi, self._handle = smi, handle
        except Exception:  # noqa: BLE001 - no amdsmi, no device: report nothing
            self._smi = None

    @property
    def available(self) -> bool:
        return self._smi is not None

    def _read(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._smi, fn)(self._handle, *args)
        except Exception:  # noqa: BLE001 - a query this device does not support reads as None
            return None

    def _clock(self, kind: str) -> dict[str, Any]:
        clock_type = getattr(getattr(self._smi, "AmdSmiClkType", None), kind, None)
        info = self._read("amdsmi_get_clock_info", clock_type) if clock_type is not None else None
        return info if isinstance(info, dict) else {}

    def max_sm_clock_hz(self) -> Optional[float]:
        if not self.available:
            return None
        mhz = _mhz(self._clock("GFX").get("max_clk"))
        return mhz * 1e6 if mhz else None

    def energy_mj(self) -> Optional[float]:
        if not self.available:
            return None
        info = self._read("amdsmi_get_energy_count")
        if not isinstance(info, dict):
            return None
        count, resolution = info.get("energy_accumulator"), info.get("counter_resolution", 1.0)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (count, resolution)):
            return None                                           # "N/A" where the device has no counter
        return count * resolution / 1000   # µJ -> mJ

    def sample(self) -> dict[str, Any]:
        if not self.available:
            return {}
        gfx, mem = self._clock("GFX"), self._clock("MEM")
        power = self._read("amdsmi_get_power_info") or {}
        temp = self._read("amdsmi_get_temp_metric", self._smi.AmdSmiTemperatureType.HOTSPOT,
                          self._smi.AmdSmiTemperatureMetric.CURRENT)
        metrics = self._read("amdsmi_get_gpu_metrics_info") or {}
        throttle = metrics.get("throttle_status") if isinstance(metrics, dict) else None
        if not isinstance(power, dict):
            power = {}
        return {
            "sm_clock_mhz": _mhz(gfx.get("clk")),
            "mem_clock_mhz": _mhz(mem.get("clk")),
            "max_sm_clock_mhz": _mhz(gfx.get("max_clk")),
            "power_w": _watts(power.get("current_socket_power", power.get("average_socket_power"))),
            "power_limit_w": _watts(power.get("power_limit", power.get("max_socket_power_limit"))),
            "temperature_c": _celsius(temp),
            "reasons": [AMD_THROTTLE] if isinstance(throttle, int) and throttle not in (0, 0xFFFFFFFF) else [],
        }
