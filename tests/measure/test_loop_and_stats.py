from __future__ import annotations

import time

import pytest

from operatorx.measure import HostClockTiming, TimingSettings, summarize
from operatorx.measure.loop import stop_reason, warmup


def test_summarize_is_exact_on_known_samples():
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s["median"] == 3.0 and s["min"] == 1.0 and s["max"] == 100.0 and s["n"] == 5
    assert s["mean"] == pytest.approx(22.0)


def test_summarize_refuses_nothing():
    with pytest.raises(ValueError):
        summarize([])


def test_warmup_honours_calls_and_floor():
    calls = []
    n, secs = warmup(lambda: calls.append(1), lambda: None,
                     TimingSettings(warmup_calls=3, warmup_floor_s=0.02, first_warmup_floor_s=0.02))
    assert n == len(calls) >= 3 and secs >= 0.02


def test_stop_rules():
    s = TimingSettings(min_samples=10, max_samples=20, min_time_s=0.5, timeout_s=1.0)
    assert stop_reason(5, 10.0, 0.1, s) is None            # below min_samples
    assert stop_reason(10, 0.1, 0.1, s) is None            # not enough measured time
    assert stop_reason(10, 0.6, 0.7, s) == "criterion"
    assert stop_reason(20, 0.1, 0.1, s) == "max_samples"
    assert stop_reason(12, 0.1, 2.0, s) == "timeout"


@pytest.mark.parametrize("bad", [{"min_samples": 0}, {"max_samples": 5, "min_samples": 10}, {"timeout_s": -1}])
def test_settings_refuse_nonsense(bad):
    with pytest.raises(ValueError):
        TimingSettings(**bad)


def test_host_clock_measures_a_known_sleep():
    settings = TimingSettings(warmup_calls=1, warmup_floor_s=0, first_warmup_floor_s=0, min_samples=10,
                              min_time_s=0)
    m = HostClockTiming(settings).measure(lambda: time.sleep(0.002))
    assert m.clock == "host" and len(m.samples_us) >= 10
    assert 1900 < m.latency_us < 6000
