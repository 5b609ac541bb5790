"""The telemetry sampler and the capped rule, with a fake NVML reader (CPU)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from operatorx.measure import telemetry
from operatorx.measure.telemetry import THROTTLE_REASONS, Telemetry, TelemetrySampler, summarize_readings


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


def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait for the reading thread to have done something, instead of sleeping a fixed few ms: a
    loaded 2-core CI machine can leave the thread unscheduled for longer than that."""
    deadline = time.perf_counter() + timeout_s
    while not condition():
        assert time.perf_counter() < deadline, f"not within {timeout_s} s"
        time.sleep(0.001)


def _reading(clock: float, *reasons: str) -> dict[str, Any]:
    return {"sm_clock_mhz": clock, "max_sm_clock_mhz": 2000, "power_w": 600.0, "temperature_c": 60,
            "mem_clock_mhz": 3200, "reasons": list(reasons)}


def test_capped_needs_a_power_or_thermal_reason_and_a_lower_clock():
    assert not summarize_readings([_reading(2000, "sw_power_cap")], None, 0.985)["capped"]     # bit at full clock
    assert not summarize_readings([_reading(1800, "gpu_idle")], None, 0.985)["capped"]         # low clock, no cap
    capped = summarize_readings([_reading(2000), _reading(1900, "sw_thermal_slowdown")], 5.0, 0.985)
    assert capped["capped"] and capped["capping_reasons"] == ["sw_thermal_slowdown"] and capped["capped_readings"] == 1
    assert capped["sm_clock_mhz"] == {"min": 1900.0, "p50": 1950.0, "max": 2000.0} and capped["energy_mj"] == 5.0


def _nvml_reading(clock: float, *reasons: str, highest: float = 2000) -> dict[str, Any]:
    bits = sum(THROTTLE_REASONS[r] for r in reasons)
    return {**_reading(clock, *reasons), "reason_bits": bits, "highest_sm_clock_mhz": highest}


def test_a_clock_far_under_the_highest_seen_with_no_reason_bit_is_capped():
    low = summarize_readings([_nvml_reading(1650), _nvml_reading(2000)], None, 0.985)    # 0.825 of the highest
    assert low["capped"] and low["capping_reasons"] == ["clock_low_no_reason"]
    assert low["reasons"] == {"clock_low_no_reason": 1}
    # the card's own settling after a cap (0.92-0.98, no reason, benchmarks §20): recorded, not retried
    assert not summarize_readings([_nvml_reading(1955)], None, 0.985)["capped"]
    assert not summarize_readings([_nvml_reading(1830)], None, 0.985)["capped"]
    assert summarize_readings([_nvml_reading(1799)], None, 0.985)["capped"]              # just under 0.9
    # idle, clocks the user set, or a bit we do not name: the clock is explained
    assert not summarize_readings([_nvml_reading(1000, "gpu_idle")], None, 0.985)["capped"]
    assert not summarize_readings([_nvml_reading(1400, "applications_clocks_setting")], None, 0.985)["capped"]
    assert not summarize_readings([{**_nvml_reading(1400), "reason_bits": 1 << 63}], None, 0.985)["capped"]
    # a board that never reaches its listed maximum is judged against what it reached
    assert not summarize_readings([_nvml_reading(1650, highest=1700)], None, 0.985)["capped"]
    # a reader that gave no bits (or does not report idleness: amdsmi) is not judged
    assert not summarize_readings([_reading(1000)], None, 0.985)["capped"]
    assert not summarize_readings([{**_nvml_reading(1000), "reason_bits": None}], None, 0.985)["capped"]
    both = summarize_readings([_nvml_reading(1500), _nvml_reading(1900, "sw_power_cap")], None, 0.985)
    assert both["capping_reasons"] == ["sw_power_cap", "clock_low_no_reason"] and both["capped_readings"] == 2


def test_a_low_clock_with_no_reason_cuts_an_attempt_short_like_a_cap():
    fake = FakeTelemetry(clock_mhz=1500)
    fake.sample = lambda: {**FakeTelemetry.sample(fake), "reason_bits": 0,   # type: ignore[method-assign]
                           "highest_sm_clock_mhz": 1980}
    with TelemetrySampler(fake, period_s=0.002) as sampler:       # type: ignore[arg-type]
        t0 = time.perf_counter()
        deadline = t0 + 2.0
        while not sampler.capped_since(t0) and time.perf_counter() < deadline:
            time.sleep(0.002)
        assert sampler.capped_since(t0)
    assert sampler.summary()["capping_reasons"] == ["clock_low_no_reason"]


class _FakeNvml:
    """pynvml as Telemetry calls it: the SM clock from a list, no reason bits."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self, clocks: list[int]):
        self.clocks = clocks

    def nvmlDeviceGetClockInfo(self, handle, kind):
        return self.clocks.pop(0) if kind == self.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetMaxClockInfo(self, handle, kind):
        return 1980

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return 0

    def __getattr__(self, name):            # power, limit, temperature: a fixed value
        return lambda *args: 500_000


def test_the_reader_keeps_the_highest_clock_it_has_read():
    t = Telemetry(None)
    t._nvml, t._handle = _FakeNvml([1500, 1980, 1700]), object()
    first, second, third = (t.sample() for _ in range(3))
    assert [r["highest_sm_clock_mhz"] for r in (first, second, third)] == [1500.0, 1980.0, 1980.0]
    assert not summarize_readings([first], None, 0.985)["capped"]      # the first reading is its own highest
    assert summarize_readings([third], None, 0.985)["capping_reasons"] == ["clock_low_no_reason"]


def test_sampler_reads_during_the_window_and_stops_at_its_end():
    fake = FakeTelemetry(clock_mhz=1900, reasons=("sw_power_cap",))
    t_open = time.perf_counter()
    with TelemetrySampler(fake, period_s=0.002) as sampler:       # type: ignore[arg-type]
        _until(lambda: len(sampler.readings) >= 10)
        assert sampler.alive
    window_s = time.perf_counter() - t_open
    assert not sampler.alive
    n = len(sampler.readings)
    summary = sampler.summary()
    assert summary["readings"] == n >= 10 and summary["capped"] and summary["power_w"]["p50"] == 500.0
    # one energy read per reading, +700 mJ each: first to last reading, inside the window
    assert summary["energy_mj"] == 700 * (n - 1) and 0 < summary["energy_s"] < window_s
    time.sleep(0.02)
    assert len(sampler.readings) == n               # nothing is added once the window has closed


def test_one_reading_thread_serves_every_window_and_a_window_that_raises_is_closed():
    """The thread lives as long as the process (joining a thread per attempt cost ~5-8 ms a case on
    the H200): windows come and go on it, and a case that raises closes its window all the same."""
    fake = FakeTelemetry()
    with TelemetrySampler(fake, period_s=0.001):   # type: ignore[arg-type]
        time.sleep(0.005)
    threads = [t for t in threading.enumerate() if t.name == "operatorx-telemetry"]
    with pytest.raises(RuntimeError):
        with TelemetrySampler(fake, period_s=0.001) as sampler:   # type: ignore[arg-type]
            time.sleep(0.005)
            raise RuntimeError("the op failed")
    assert not sampler.alive
    n = len(sampler.readings)
    with TelemetrySampler(fake, period_s=0.001) as other:   # type: ignore[arg-type]
        _until(lambda: len(other.readings) >= 2)
    assert len(sampler.readings) == n and len(other.readings) >= 2
    assert [t for t in threading.enumerate() if t.name == "operatorx-telemetry"] == threads


def test_without_nvml_nothing_is_sampled_and_nothing_is_capped():
    with TelemetrySampler(Telemetry(None)) as sampler:
        pass
    assert sampler.summary() == {"available": False, "capped": False}


class FakeAmdSmi:
    """The slice of amdsmi the AMD reader uses, with a recent release's units (W, °C, µJ)."""

    class AmdSmiClkType:
        GFX, MEM = "gfx", "mem"

    class AmdSmiTemperatureType:
        HOTSPOT = "hotspot"

    class AmdSmiTemperatureMetric:
        CURRENT = "current"

    def __init__(self, throttle=0, gfx_clk=2100):
        self.throttle, self.gfx_clk, self.energy = throttle, gfx_clk, 0

    def amdsmi_init(self): ...
    def amdsmi_get_processor_handles(self): return ["gpu0", "gpu1"]
    def amdsmi_get_gpu_device_bdf(self, h): return {"gpu0": "0000:05:00.0", "gpu1": "0000:c1:00.0"}[h]
    def amdsmi_get_clock_info(self, h, kind):
        return {"clk": self.gfx_clk, "max_clk": 2100} if kind == "gfx" else {"clk": 1300, "max_clk": 1300}
    def amdsmi_get_power_info(self, h): return {"current_socket_power": 650, "power_limit": 750_000_000}
    def amdsmi_get_temp_metric(self, h, sensor, metric): return 71
    def amdsmi_get_gpu_metrics_info(self, h): return {"throttle_status": self.throttle}
    def amdsmi_get_energy_count(self, h):
        self.energy += 1000
        return {"energy_accumulator": self.energy, "counter_resolution": 15.3}


def test_amd_reader_speaks_the_same_interface_and_finds_the_gpu_by_bus_id():
    from operatorx.measure.telemetry_amd import AmdTelemetry

    smi = FakeAmdSmi(throttle=1, gfx_clk=1700)
    amd = AmdTelemetry(0, pci_bus_id="0000:C1:00.0", module=smi)
    assert amd.available and amd._handle == "gpu1" and amd.max_sm_clock_hz() == 2.1e9
    s = amd.sample()
    assert s["power_w"] == 650 and s["power_limit_w"] == 750 and s["temperature_c"] == 71
    assert s["reasons"] == ["amd_throttle"] and s["sm_clock_mhz"] == 1700
    with TelemetrySampler(amd, period_s=0.002) as sampler:        # type: ignore[arg-type]
        _until(lambda: len(sampler.readings) >= 2)
    summary = sampler.summary()
    assert summary["capped"] and summary["capping_reasons"] == ["amd_throttle"]
    # each reading reads the accumulator (+1000 counts of 15.3 µJ): first reading to last
    assert summary["energy_mj"] == pytest.approx((summary["readings"] - 1) * 1000 * 15.3 / 1000)
    calm = AmdTelemetry(0, module=FakeAmdSmi())
    assert calm.sample()["reasons"] == [] and AmdTelemetry(0, module=object()).available is False


def test_summary_ignores_readings_that_are_not_numbers():
    """None, NaN and amdsmi's "N/A" are what a device does not report: never a value, never a crash."""
    readings = [_reading(1800, "sw_power_cap"), {**_reading(1900), "power_w": None, "temperature_c": float("nan")},
                {"sm_clock_mhz": "N/A", "max_sm_clock_mhz": "N/A", "mem_clock_mhz": "N/A", "power_w": "N/A",
                 "temperature_c": None, "reasons": None}]
    s = summarize_readings(readings, None, 0.985)
    assert s["readings"] == 3 and s["sm_clock_mhz"] == {"min": 1800.0, "p50": 1850.0, "max": 1900.0}
    assert s["power_w"]["max"] == 600.0 and s["temperature_c"] == {"min": 60.0, "p50": 60.0, "max": 60.0}
    assert s["capped"] and s["capped_readings"] == 1 and s["max_sm_clock_mhz"] == 2000


class _FailingTelemetry(FakeTelemetry):
    """Every other read raises, as a driver call can; the energy counter is not there at all."""

    def __init__(self):
        super().__init__(clock_mhz=1900, reasons=("sw_power_cap",))
        self.calls = 0

    def sample(self):
        self.calls += 1
        if self.calls % 2:
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        return super().sample()

    def energy_mj(self):
        raise RuntimeError("no energy counter")


def test_a_read_that_raises_does_not_end_the_sampling():
    failing = _FailingTelemetry()
    with TelemetrySampler(failing, period_s=0.001) as sampler:     # type: ignore[arg-type]
        _until(lambda: failing.calls >= 8)            # four reads that raised, four that did not
    s = sampler.summary()
    assert s["failed_readings"] >= 2 and s["readings"] > s["failed_readings"]
    assert s["capped"] and s["energy_mj"] is None


def test_amd_reader_reads_na_as_nothing():
    from operatorx.measure.telemetry_amd import AmdTelemetry

    class NaSmi(FakeAmdSmi):
        def amdsmi_get_clock_info(self, h, kind): return {"clk": "N/A", "max_clk": "N/A"}
        def amdsmi_get_energy_count(self, h): return {"energy_accumulator": "N/A", "counter_resolution": "N/A"}
        def amdsmi_get_power_info(self, h): return "N/A"

    amd = AmdTelemetry(0, module=NaSmi(throttle=1))
    s = amd.sample()
    assert s["sm_clock_mhz"] is None and s["max_sm_clock_mhz"] is None and s["power_w"] is None
    assert amd.max_sm_clock_hz() is None and amd.energy_mj() is None
    with TelemetrySampler(amd, period_s=0.002) as sampler:          # type: ignore[arg-type]
        _until(lambda: len(sampler.readings) >= 2)
    summary = sampler.summary()
    assert not summary["capped"] and "sm_clock_mhz" not in summary and "failed_readings" not in summary


def test_amd_reader_matches_torchs_8_digit_bus_id_to_amdsmis_4_digit_one():
    """`Telemetry.for_torch_device` writes the domain with 8 digits, amdsmi with 4: the same GPU."""
    from operatorx.measure.telemetry_amd import AmdTelemetry

    assert AmdTelemetry(0, pci_bus_id="00000000:c1:00.0", module=FakeAmdSmi())._handle == "gpu1"
    assert AmdTelemetry(1, pci_bus_id="00000000:05:00.0", module=FakeAmdSmi())._handle == "gpu0"
    assert AmdTelemetry(1, pci_bus_id="00000000:99:00.0", module=FakeAmdSmi())._handle == "gpu1"   # none: index


def test_only_readings_inside_the_timed_window_judge_the_attempt():
    fake = FakeTelemetry(clock_mhz=1500, reasons=("sw_power_cap",))   # capped during warmup
    with TelemetrySampler(fake, period_s=0.002) as sampler:           # type: ignore[arg-type]
        _until(lambda: len(sampler.readings) >= 5)
        fake.clock_mhz, fake.reasons = 1980, []                       # the timed calls ran at full clock
        _until(lambda: sampler.readings[-1]["sm_clock_mhz"] == 1980)  # no capped read still in flight
        window_start = time.perf_counter()
        _until(lambda: sum(r["t_s"] >= window_start for r in sampler.readings) >= 3)
    assert sampler.summary()["capped"]                                # the whole window saw the cap
    judged = sampler.summary(since_s=window_start)
    assert not judged["capped"] and judged["readings_before_window"] >= 5
    late = sampler.summary(since_s=time.perf_counter() + 1)            # no reading inside: the last one stands in
    assert late["readings"] == 1 and not late["capped"]


def test_a_stale_reading_or_two_do_not_make_a_long_window_capped():
    """A rested retry often starts with a reading or two still showing the previous attempt's cap;
    they cannot move a median over the window. A tenth of the readings can."""
    window = [_reading(1400, "sw_power_cap")] + [_reading(1980)] * 19
    one = summarize_readings(window, None, 0.985)
    assert not one["capped"] and one["capped_readings"] == 1 and one["capping_reasons"] == ["sw_power_cap"]
    two = summarize_readings([_reading(1400, "sw_power_cap")] * 2 + [_reading(1980)] * 18, None, 0.985)
    assert two["capped"] and two["capped_readings"] == 2


def test_capped_since_needs_three_readings_in_the_window_before_giving_up():
    fake = FakeTelemetry(clock_mhz=1400, reasons=("sw_power_cap",))
    sampler = TelemetrySampler(fake, period_s=0.002)                   # type: ignore[arg-type]
    t0 = time.perf_counter()
    sampler.readings = [{**fake.sample(), "t_s": t0 - 1}] * 5 + [{**fake.sample(), "t_s": t0 + 0.001}] * 2
    assert not sampler.capped_since(t0)                                # two inside: too few to judge
    sampler.readings.append({**fake.sample(), "t_s": t0 + 0.002})
    assert sampler.capped_since(t0)
    fake.clock_mhz, fake.reasons = 1980, []
    sampler.readings += [{**fake.sample(), "t_s": t0 + 0.003}] * 30      # then at full clock for long
    assert not sampler.capped_since(t0)


def test_one_stale_capped_reading_does_not_cut_a_short_window():
    """A rested retry's first reading may still show the previous attempt's cap: one reading of three
    is a third, but it would be half a percent of the full window. Two capped, the latest among
    them, are needed to give up early."""
    fake = FakeTelemetry(clock_mhz=1400, reasons=("sw_power_cap",))
    sampler = TelemetrySampler(fake, period_s=0.002)                   # type: ignore[arg-type]
    t0 = time.perf_counter()
    capped = {**fake.sample(), "t_s": t0 + 0.001}
    fake.clock_mhz, fake.reasons = 1980, []
    clean = {**fake.sample(), "t_s": t0 + 0.002}
    sampler.readings = [capped, clean, clean]
    assert not sampler.capped_since(t0)
    sampler.readings = [capped, clean, capped]
    assert sampler.capped_since(t0)
    sampler.readings = [capped, capped, clean]                          # the cap has lifted: go on
    assert not sampler.capped_since(t0)


class _SlowTelemetry(FakeTelemetry):
    """Each reading takes 8 ms, as five or six NVML calls do on the H200 machines."""

    def sample(self):
        time.sleep(0.008)
        return super().sample()


def test_a_window_shorter_than_a_reading_still_gets_one(monkeypatch):
    """An attempt that ends before the reader's first reading waits for it (bounded): an attempt
    with no reading cannot be judged, and its row would carry no clock."""
    monkeypatch.setattr(telemetry, "_FIRST_READING_WAIT_S", 10.0)   # bounded all the same; a loaded CI is slow
    slow = _SlowTelemetry(clock_mhz=1900, reasons=("sw_power_cap",))
    with TelemetrySampler(slow, period_s=0.001):                  # type: ignore[arg-type]
        time.sleep(0.02)
    with TelemetrySampler(slow, period_s=0.001) as short:         # type: ignore[arg-type]
        pass                                                      # closes at once, mid-reading of the last window
    assert len(short.readings) >= 1 and short.summary()["sm_clock_mhz"]["p50"] == 1900
