"""GPU conditions during a measurement, read through NVML: clocks, power, temperature, throttling.

`TelemetrySampler` reads the GPU every few ms on a thread while a case is timed. A reading is
capped when it shows a power or thermal clock-event reason together with an SM clock under
`capped_clock_fraction` of its maximum; an attempt is *capped* when at least a tenth of its
readings are (`CAPPED_SHARE`): then its number describes the cap, not the kernel, and the runner
measures again. A stale reading or two as a rested retry begins cannot move a median taken over
the window, and counting them made every retry of a GEMM that caps itself look capped. A reason
without a lower clock (the power cap bit is often set at full clock) does not make an attempt
capped; the reasons are still recorded.

A reading whose clock-event bits are all zero and whose SM clock is far under the highest this reader
has seen (`LOW_CLOCK_FRACTION`) counts as capped too, by the reason `clock_low_no_reason`: nothing NVML
can name holds the clock back, yet it is low. Its cause is unknown; its number is not the card's, and
the attempt is retried. Against the highest clock seen rather than NVML's maximum, a card that never
reaches its listed maximum (many GeForce and workstation boards) does not read capped all the time.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional

import numpy as np

__all__ = ["CAPPED_SHARE", "CAPPING_REASONS", "LOW_CLOCK", "LOW_CLOCK_FRACTION", "THROTTLE_REASONS", "Telemetry",
           "TelemetrySampler"]

CAPPED_SHARE = 0.1
"""An attempt is capped when at least this share of its readings (one at least) are."""
_MIN_READINGS_TO_GIVE_UP = 3
_FIRST_READING_WAIT_S = 0.03
"""A window that closes before its first reading waits this long for one. Without it a 10 ms
attempt could end while the reader was still busy with the last window (a reading is five or six
NVML calls of milliseconds each), and the case was then stored with no clock at all."""

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
#: Reasons that mean the clocks were held below what the kernel would otherwise get
#: (`amd_throttle`: amdsmi's throttle status, telemetry_amd.py).
CAPPING_REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                   "hw_power_brake_slowdown", "amd_throttle")
LOW_CLOCK = "clock_low_no_reason"
"""The reason given to a reading whose SM clock is under `LOW_CLOCK_FRACTION` of the highest this reader
has seen while all of NVML's clock-event bits are zero (not idle, no cap, no clocks set by the user)."""
LOW_CLOCK_FRACTION = 0.9
"""Under this share of the highest SM clock seen, a reading with no reason is a low clock nothing explains:
such a clock made a case read several % slow. Not `capped_clock_fraction` (0.985), nor 0.95: right
after power-capped work a card runs some cases a few % under its highest clock with no reason set,
and their retries read the same. That is the card's own choice under load, recorded in the row, not
retried."""


class Telemetry:
    """NVML reader for one GPU; every method degrades to {} where NVML is not there (CPU, ROCm)."""

    def __init__(self, device_index: Optional[int] = 0, pci_bus_id: Optional[str] = None):
        """`device_index=None` gives a reader that reports nothing (the CPU device). With
        `pci_bus_id` the GPU is found by bus id: NVML's index 0 need not be CUDA's device 0
        (CUDA_VISIBLE_DEVICES reorders CUDA's, not NVML's)."""
        self._nvml: Any = None
        self._handle: Any = None
        if device_index is None:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            if pci_bus_id:
                self._handle = pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id.encode())
            else:
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
            self._nvml = pynvml
        except Exception:
            self._nvml = None

    @classmethod
    def for_torch_device(cls, index: int = 0) -> Any:
        """The reader of torch's GPU `index`, matched by PCI bus id: NVML on CUDA, amdsmi on ROCm."""
        hip = False
        try:
            import torch

            hip = bool(torch.version.hip)
            p: Any = torch.cuda.get_device_properties(index)    # torch's stubs lack the pci_* fields
            bus = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
        except Exception:  # noqa: BLE001 - no bus id: fall back to the index, and say nothing worse
            bus = None
        if hip:
            from operatorx.measure.telemetry_amd import AmdTelemetry

            return AmdTelemetry(index, pci_bus_id=bus)
        reader = cls(index, pci_bus_id=bus)
        return reader if reader.available or bus is None else cls(index)

    def energy_mj(self) -> Optional[int]:
        """Energy the GPU used since the driver loaded, in mJ (None where NVML has no counter)."""
        return self._read("nvmlDeviceGetTotalEnergyConsumption") if self.available else None

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

    def _constant(self, name: str, fn: str, *args: Any) -> Optional[Any]:
        """Values that do not change while we run (max clock, power limit): one NVML call each, ever.
        NVML calls cost milliseconds each, and a reading every 5 ms must stay cheap."""
        cache = self.__dict__.setdefault("_constants", {})
        if name not in cache:
            cache[name] = self._read(fn, *args)
        return cache[name]

    def sample(self) -> dict[str, Any]:
        """One reading; `reasons` lists the active clock-event reasons by name."""
        if not self.available:
            return {}
        nv = self._nvml
        power_mw = self._read("nvmlDeviceGetPowerUsage")
        limit_mw = self._constant("power_limit", "nvmlDeviceGetEnforcedPowerLimit")
        bits = self._read("nvmlDeviceGetCurrentClocksEventReasons")
        if bits is None:
            bits = self._read("nvmlDeviceGetCurrentClocksThrottleReasons")
        clock = self._read("nvmlDeviceGetClockInfo", nv.NVML_CLOCK_SM)
        return {
            "sm_clock_mhz": clock,
            "mem_clock_mhz": self._read("nvmlDeviceGetClockInfo", nv.NVML_CLOCK_MEM),
            "max_sm_clock_mhz": self._constant("max_sm_clock", "nvmlDeviceGetMaxClockInfo", nv.NVML_CLOCK_SM),
            "power_w": power_mw / 1e3 if power_mw is not None else None,
            "power_limit_w": limit_mw / 1e3 if limit_mw is not None else None,
            "temperature_c": self._read("nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU),
            "reasons": [name for name, bit in THROTTLE_REASONS.items() if bits is not None and bits & bit],
            # NVML names idleness (gpu_idle) and clocks the user set among its reasons: all bits zero
            # means a busy GPU that nothing NVML knows holds back (what `_reading_low_no_reason` needs)
            "reason_bits": bits,
            "highest_sm_clock_mhz": self._highest(clock),
        }

    def _highest(self, clock: Any) -> Optional[float]:
        """The highest SM clock this reader has read so far, this reading included."""
        best = self.__dict__.get("_highest_sm_clock")
        if isinstance(clock, (int, float)) and not isinstance(clock, bool) and (best is None or clock > best):
            best = self.__dict__["_highest_sm_clock"] = float(clock)
        return best



_SUMMARIZED = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c")
_POWER_THERMAL = frozenset(CAPPING_REASONS)


def _number(value: Any) -> Optional[float]:
    """A reading as a finite float, else None: a reader may give None, a NaN, or a string such as
    amdsmi's "N/A" for what the device does not report, and none of those is a value to summarize."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        return None
    value = float(value)
    return value if np.isfinite(value) else None


def _reading_capped(r: dict[str, Any], capped_clock_fraction: float) -> bool:
    """A power or thermal reason together with an SM clock under the fraction of its maximum, or a low
    clock that no reason explains (`_reading_low_no_reason`)."""
    limit = _number(r.get("max_sm_clock_mhz"))
    clock = _number(r.get("sm_clock_mhz"))
    return bool(_POWER_THERMAL & set(r.get("reasons") or []) and clock is not None and limit
                and clock < capped_clock_fraction * limit) or _reading_low_no_reason(r)


def _reading_low_no_reason(r: dict[str, Any]) -> bool:
    """NVML's clock-event bits read as zero (any bit set, even one we do not name, explains the clock),
    and the SM clock under LOW_CLOCK_FRACTION of the highest the reader has seen. Readers that do not
    report idleness as a reason (amdsmi's throttle status) give no bits and are not judged: there, no
    reason does not mean a busy GPU."""
    highest = _number(r.get("highest_sm_clock_mhz"))
    clock = _number(r.get("sm_clock_mhz"))
    return bool(r.get("reason_bits") == 0 and clock is not None and highest and clock < LOW_CLOCK_FRACTION * highest)


def summarize_readings(readings: list[dict[str, Any]], energy_mj: Optional[float],
                       capped_clock_fraction: float) -> dict[str, Any]:
    """min/p50/max per quantity, reason counts, energy, and whether the readings show a cap."""
    out: dict[str, Any] = {"readings": len(readings)}
    for key in _SUMMARIZED:
        values = [v for v in (_number(r.get(key)) for r in readings) if v is not None]
        if values:
            out[key] = {"min": float(np.min(values)), "p50": float(np.median(values)), "max": float(np.max(values))}
    counts: dict[str, int] = {}
    capped_readings = 0
    for r in readings:
        for reason in r.get("reasons") or []:
            counts[reason] = counts.get(reason, 0) + 1
        if _reading_low_no_reason(r):
            counts[LOW_CLOCK] = counts.get(LOW_CLOCK, 0) + 1
        capped_readings += _reading_capped(r, capped_clock_fraction)
    out["reasons"] = counts
    out["capped_readings"] = capped_readings
    out["capped"] = capped_readings > 0 and capped_readings >= CAPPED_SHARE * len(readings)
    out["capping_reasons"] = [r for r in (*CAPPING_REASONS, LOW_CLOCK) if r in counts] if capped_readings else []
    failed = sum("error" in r for r in readings)
    if failed:
        out["failed_readings"] = failed
    max_clock = next((m for m in (_number(r.get("max_sm_clock_mhz")) for r in readings) if m), None)
    if max_clock:
        out["max_sm_clock_mhz"] = max_clock
    out["energy_mj"] = energy_mj
    return out


class _Reader:
    """The process's reading thread for one GPU: started once, it reads while a window is open and
    waits otherwise. A thread per attempt had to be joined at the attempt's end, and the join waited
    for the reading in flight plus a last energy read, milliseconds per attempt in a case that takes
    tens of them."""

    def __init__(self, telemetry: Any):
        self.telemetry = telemetry
        self.period_s = 0.005
        self._lock = threading.Condition()
        self._open = threading.Event()
        self._wake = threading.Event()
        self._sink: Optional[list[dict[str, Any]]] = None
        self._thread = threading.Thread(target=self._loop, name="operatorx-telemetry", daemon=True)
        self._thread.start()

    @classmethod
    def of(cls, telemetry: Any) -> _Reader:
        reader = getattr(telemetry, "_operatorx_reader", None)
        if not isinstance(reader, _Reader) or not reader._thread.is_alive():
            reader = cls(telemetry)
            telemetry._operatorx_reader = reader
        return reader

    def open(self, sink: list[dict[str, Any]], period_s: float) -> None:
        """Readings go to `sink` from now on (one window at a time: a new one replaces the last)."""
        with self._lock:
            self._sink, self.period_s = sink, period_s
            self._open.set()
            self._wake.set()            # a reader resting between readings starts one now

    def close(self, sink: list[dict[str, Any]], first_reading_wait_s: float = 0.0) -> None:
        """No reading is added to `sink` after this returns; the one in flight, if any, is dropped,
        unless the window has none yet: then it waits up to `first_reading_wait_s` for one (an
        attempt with no reading could not be judged capped or not)."""
        with self._lock:
            if self._sink is sink and not sink and first_reading_wait_s > 0 and self._thread.is_alive():
                self._lock.wait_for(lambda: bool(sink) or self._sink is not sink, timeout=first_reading_wait_s)
            if self._sink is sink:
                self._sink = None
                self._open.clear()

    @property
    def reading(self) -> bool:
        return self._open.is_set() and self._thread.is_alive()

    def _energy(self) -> Optional[float]:
        try:
            return _number(self.telemetry.energy_mj())
        except Exception:  # noqa: BLE001 - no energy figure, nothing worse
            return None

    def _loop(self) -> None:
        """A read that raises is recorded as a failed reading and sampling goes on: a thread that
        died on its first read would leave an attempt with no readings, judged not capped."""
        while True:
            self._open.wait()
            with self._lock:
                sink = self._sink
            if sink is None:
                continue
            self._wake.clear()          # this reading answers any wake-up so far (no second one right after)
            try:
                reading = {**self.telemetry.sample(), "energy_mj": self._energy()}
            except Exception as err:  # noqa: BLE001
                reading = {"error": f"{type(err).__name__}: {str(err)[:200]}"}
            with self._lock:
                if self._sink is not sink:
                    continue            # the window closed while this reading was taken
                sink.append({**reading, "t_s": time.perf_counter()})
                period_s = self.period_s
                self._lock.notify_all()
            self._wake.wait(period_s)


def _energy_between(readings: list[dict[str, Any]]) -> tuple[Optional[float], Optional[float]]:
    """(mJ, s) between the first and the last reading that carry the energy counter."""
    marked = [(r["energy_mj"], r["t_s"]) for r in readings
              if _number(r.get("energy_mj")) is not None and _number(r.get("t_s")) is not None]
    if len(marked) < 2:
        return None, None
    (e0, t0), (e1, t1) = marked[0], marked[-1]
    if e1 < e0:                  # the counter wrapped or was reset: no figure, not a negative one
        return None, None
    return float(e1 - e0), float(t1 - t0)


class TelemetrySampler:
    """Reads the GPU every `period_s` for the length of a `with` block, on the process's reading
    thread for that GPU (`_Reader`): entering opens a window, leaving closes it without waiting for
    the reading in flight. Each reading carries the energy counter, so the energy of the window is
    the difference between its first and last readings. The main thread makes no NVML call itself
    (each costs 1-3 ms).
    """

    def __init__(self, telemetry: Telemetry, period_s: float = 0.005, capped_clock_fraction: float = 0.985):
        self.telemetry = telemetry
        self.period_s = period_s
        self.capped_clock_fraction = capped_clock_fraction
        self.readings: list[dict[str, Any]] = []
        self._reader: Optional[_Reader] = None

    def __enter__(self) -> TelemetrySampler:
        if self.telemetry.available:
            self._reader = _Reader.of(self.telemetry)
            self._reader.open(self.readings, self.period_s)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._reader is not None:
            self._reader.close(self.readings, first_reading_wait_s=_FIRST_READING_WAIT_S)
            self._reader = None

    @property
    def alive(self) -> bool:
        """Whether readings are being taken for this window now."""
        return self._reader is not None and self._reader.reading

    def capped_since(self, since_s: float) -> bool:
        """Whether the readings taken since `since_s` already judge the attempt capped: the timer then
        stops sampling it early, and the retry rests the GPU (measure/retry.py). Stricter than the
        final verdict on a short window: at least three readings, two of them capped, the latest
        among them. One stale reading as a rested retry begins is a third of three readings but
        would be half a percent of the full window, which forgives it."""
        readings = [r for r in list(self.readings) if r.get("t_s", since_s) >= since_s]
        if len(readings) < _MIN_READINGS_TO_GIVE_UP or not self._is_capped(readings[-1]):
            return False
        capped = sum(self._is_capped(r) for r in readings)
        return capped >= 2 and capped >= CAPPED_SHARE * len(readings)

    def _is_capped(self, reading: dict[str, Any]) -> bool:
        return _reading_capped(reading, self.capped_clock_fraction)

    def summary(self, since_s: Optional[float] = None) -> dict[str, Any]:
        """The readings' summary. With `since_s` (a perf_counter time: when the timed calls began)
        only readings from then on judge the attempt, so a cap during warmup or right after the
        previous attempt does not mark timed calls that ran at full clock; if none fell in that
        window, the last reading before it stands in. Energy: first reading to last of the whole
        sampler window (`energy_s` long)."""
        if not self.telemetry.available:
            return {"available": False, "capped": False}
        readings = list(self.readings)
        energy, energy_s = _energy_between(readings)
        if since_s is not None:
            inside = [r for r in readings if r.get("t_s", since_s) >= since_s]
            before = [r for r in readings if r.get("t_s", since_s) < since_s]
            readings = inside or before[-1:]
        out = {"available": True, **summarize_readings(readings, energy, self.capped_clock_fraction),
               "energy_s": energy_s}
        if since_s is not None:
            out["readings_before_window"] = len(self.readings) - len(readings)
        return out
