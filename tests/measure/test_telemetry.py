"""The telemetry sampler and the capped rule, with a fake NVML reader (CPU)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from operatorx.measure.telemetry import Telemetry, TelemetrySampler, summarize_readings


class FakeTelemetry:
    available = True

    def __init__(self, clock_mhz: float = 1980, reasons: tuple[str, ...] = ()):
        self.clock_mhz, self.reasons, self.energy = clock_mhz, list(reasons), 1000

    def sample(self) -> dict[str, Any]:
        return {"sm_clock_mhz": self.clock_mhz, "mem_clock_mhz": 3201, "max_sm_clock_mhz": 1980, "power_w": 500.0,
                "temperature_c": 50, "reasons": list(self.reasons)}

    def energy_mj(self) -> int:
        self.energy += 700
        return self.energy


def _reading(clock: float, *reasons: str) -> dict[str, Any]:
    return {"sm_clock_mhz": clock, "max_sm_clock_mhz": 2000, "power_w": 600.0, "temperature_c": 60,
            "mem_clock_mhz": 3200, "reasons": list(reasons)}


def test_capped_needs_a_power_or_thermal_reason_and_a_lower_clock():
    assert not summarize_readings([_reading(2000, "sw_power_cap")], None, 0.985)["capped"]     # bit at full clock
    assert not summarize_readings([_reading(1800, "gpu_idle")], None, 0.985)["capped"]         # low clock, no cap
    capped = summarize_readings([_reading(2000), _reading(1900, "sw_thermal_slowdown")], 5.0, 0.985)
    assert capped["capped"] and capped["capping_reasons"] == ["sw_thermal_slowdown"] and capped["capped_readings"] == 1
    assert capped["sm_clock_mhz"] == {"min": 1900.0, "p50": 1950.0, "max": 2000.0} and capped["energy_mj"] == 5.0


def test_sampler_reads_during_the_window_and_joins_at_the_end():
    fake = FakeTelemetry(clock_mhz=1900, reasons=("sw_power_cap",))
    with TelemetrySampler(fake, period_s=0.002) as sampler:       # type: ignore[arg-type]
        time.sleep(0.05)
        assert sampler.alive
    assert not sampler.alive
    summary = sampler.summary()
    assert summary["readings"] >= 10 and summary["capped"] and summary["energy_mj"] == 700
    assert summary["power_w"]["p50"] == 500.0


def test_sampler_thread_never_outlives_a_case_that_raises():
    before = threading.active_count()
    with pytest.raises(RuntimeError):
        with TelemetrySampler(FakeTelemetry(), period_s=0.001):   # type: ignore[arg-type]
            raise RuntimeError("the op failed")
    assert threading.active_count() == before
    assert not any(t.name == "operatorx-telemetry" for t in threading.enumerate())


def test_without_nvml_nothing_is_sampled_and_nothing_is_capped():
    with TelemetrySampler(Telemetry(None)) as sampler:
        pass
    assert sampler.summary() == {"available": False, "capped": False}
