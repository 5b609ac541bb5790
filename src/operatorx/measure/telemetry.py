"""GPU conditions around a measurement, read through NVML: clocks, power, temperature, throttling.

A measurement taken while the GPU reported a clock cap is flagged (and retried by the runner):
such a number describes the cap, not the kernel.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["Telemetry", "THROTTLE_REASONS", "CAPPING_REASONS"]

#: NVML clock-event reason bits (nvmlClocksEventReason*), by name.
THROTTLE_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
#: Reasons that mean the clocks were held below what the kernel would otherwise get.
CAPPING_REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                   "hw_power_brake_slowdown")


class Telemetry:
    """NVML reader for one GPU; every method degrades to {} where NVML is not there (CPU, ROCm)."""

    def __init__(self, device_index: Optional[int] = 0):
        """`device_index=None` gives a reader that reports nothing (the CPU device)."""
        self._nvml: Any = None
        self._handle: Any = None
        if device_index is None:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
            self._nvml = pynvml
        except Exception:
            self._nvml = None

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def _read(self, fn: str, *args: Any) -> Optional[Any]:
        try:
            return getattr(self._nvml, fn)(self._handle, *args)
        except Exception:
            return None

    def max_sm_clock_hz(self) -> Optional[float]:
        if not self.available:
            return None
        mhz = self._read("nvmlDeviceGetMaxClockInfo", self._nvml.NVML_CLOCK_SM)
        return mhz * 1e6 if mhz else None

    def sample(self) -> dict[str, Any]:
        """One reading; `reasons` lists the active clock-event reasons by name."""
        if not self.available:
            return {}
        nv = self._nvml
        power_mw = self._read("nvmlDeviceGetPowerUsage")
        limit_mw = self._read("nvmlDeviceGetEnforcedPowerLimit")
        bits = self._read("nvmlDeviceGetCurrentClocksEventReasons")
        if bits is None:
            bits = self._read("nvmlDeviceGetCurrentClocksThrottleReasons")
        return {
            "sm_clock_mhz": self._read("nvmlDeviceGetClockInfo", nv.NVML_CLOCK_SM),
            "mem_clock_mhz": self._read("nvmlDeviceGetClockInfo", nv.NVML_CLOCK_MEM),
            "max_sm_clock_mhz": self._read("nvmlDeviceGetMaxClockInfo", nv.NVML_CLOCK_SM),
            "power_w": power_mw / 1e3 if power_mw is not None else None,
            "power_limit_w": limit_mw / 1e3 if limit_mw is not None else None,
            "temperature_c": self._read("nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU),
            "reasons": [name for name, bit in THROTTLE_REASONS.items() if bits is not None and bits & bit],
        }

    @staticmethod
    def capped(*samples: dict[str, Any]) -> list[str]:
        """The capping reasons present in any of the samples."""
        seen = {r for s in samples for r in s.get("reasons", [])}
        return [r for r in CAPPING_REASONS if r in seen]
