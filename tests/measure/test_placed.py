"""measure/placed.py: placements timed in mirrored rounds, their medians, the merged telemetry."""

from __future__ import annotations

import statistics

import pytest

from operatorx.measure.measurement import Measurement
from operatorx.measure.placed import measure_placed, merge_telemetry, round_order
from operatorx.measure.record import TimerRecord
from operatorx.measure.settings import TimingSettings
from operatorx.measure.stats import summarize


class _NoTelemetry:
    available = False


class _FakeTimer:
    """Each fn returns its placement's base latency; the timer draws `min_samples` samples around it
    and logs which placement it timed, with which settings."""

    method = "fake"
    flusher = None

    def __init__(self, settings: TimingSettings, bases_us: dict[int, float]):
        self.settings = settings
        self.bases_us = bases_us
        self.log: list[tuple[int, TimingSettings]] = []

    def measure(self, fn, pause_s=0.0, give_up=None):
        placement = fn()
        self.log.append((placement, self.settings))
        base = self.bases_us[placement]
        samples = [base + 0.01 * i for i in range(self.settings.min_samples)]
        busy = [s - 0.5 for s in samples]
        record = TimerRecord(l2_state="warm", spin=False, busy_us_median=statistics.median(busy),
                             busy_samples_us=busy)
        return Measurement(method=self.method, clock="device", samples_us=samples, summary=summarize(samples),
                           warmup_calls=self.settings.warmup_calls, warmup_s=0.001, stop_reason="noise_target",
                           details=record)


def _fns(n):
    return [lambda p=p: p for p in range(n)]


def test_rounds_are_mirrored():
    assert round_order(3, 2) == [(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0)]
    assert round_order(2, 3) == [(0, 0), (0, 1), (1, 1), (1, 0), (2, 0), (2, 1)]


def test_three_placements_median_over_placements_and_spread():
    settings = TimingSettings(min_samples=10, throttle_retries=0)
    timer = _FakeTimer(settings, {0: 10.0, 1: 12.0, 2: 10.5})
    log = timer.log                               # shared by the copies measure_placed makes
    done = measure_placed(timer, _fns(3), _NoTelemetry(), settings)  # type: ignore[arg-type]
    # each placement twice, in mirrored order; the second visit skips the warmup floor
    assert [p for p, _ in log] == [0, 1, 2, 2, 1, 0]
    first, later = log[0][1], log[3][1]
    assert first.min_samples == 5 and first.warmup_floor_s == settings.warmup_floor_s
    assert later.min_samples == 5 and later.warmup_calls == 1 and later.warmup_floor_s == 0.0
    assert first.noise_target == pytest.approx(0.005 * 2 ** 0.5)
    # placement p's samples: base + 0.00..0.04 twice -> median base + 0.02
    assert done.per_placement_us == pytest.approx([10.02, 12.02, 10.52])
    assert done.attempted.measurement.latency_us == pytest.approx(10.52)
    assert done.spread_pct == pytest.approx((12.02 - 10.02) / 10.52 * 100)
    assert done.per_placement_busy_us == pytest.approx([9.52, 11.52, 10.02])
    m = done.attempted.measurement
    assert len(m.samples_us) == 30 and m.details.busy_us_median == pytest.approx(10.02)
    assert len(m.details.busy_samples_us) == 30
    assert [(a["placement"], a["round"]) for a in done.attempted.attempts] == \
        [(0, 0), (1, 0), (2, 0), (2, 1), (1, 1), (0, 1)]
    assert done.rounds == 2


def test_one_placement_is_the_plain_measurement():
    settings = TimingSettings(min_samples=10, throttle_retries=0)
    timer = _FakeTimer(settings, {0: 7.0})
    done = measure_placed(timer, _fns(1), _NoTelemetry(), settings)  # type: ignore[arg-type]
    assert done.rounds == 1 and len(timer.log) == 1 and timer.log[0][1] is settings
    assert done.attempted.measurement.latency_us == pytest.approx(7.045)
    assert done.spread_pct == 0.0


def test_merged_telemetry():
    a = {"available": True, "readings": 4, "capped_readings": 0, "capped": False, "reasons": {"sw_power_cap": 1},
         "capping_reasons": [], "sm_clock_mhz": {"min": 1900, "p50": 1980, "max": 1980}, "energy_mj": 10.0,
         "energy_s": 0.1}
    b = {"available": True, "readings": 6, "capped_readings": 3, "capped": True, "reasons": {"sw_power_cap": 3},
         "capping_reasons": ["sw_power_cap"], "sm_clock_mhz": {"min": 1500, "p50": 1700, "max": 1980},
         "energy_mj": 20.0, "energy_s": 0.2}
    c = {**a, "sm_clock_mhz": {"min": 1950, "p50": 1970, "max": 1990}, "energy_mj": None}
    out = merge_telemetry([a, b, c])
    assert out["capped"] is True and out["readings"] == 14 and out["capped_readings"] == 3
    assert out["reasons"] == {"sw_power_cap": 5} and out["capping_reasons"] == ["sw_power_cap"]
    assert out["sm_clock_mhz"] == {"min": 1500, "p50": 1970, "max": 1990}
    assert out["energy_mj"] is None                    # one window without energy: no sum
    assert merge_telemetry([a, b])["energy_mj"] == pytest.approx(30.0)
    assert merge_telemetry([{"available": False, "capped": False}, a]) == {"available": False, "capped": False}
