from __future__ import annotations

import time

import numpy as np
import pytest

from operatorx.measure import HostClockTiming, TimingSettings, summarize
from operatorx.measure.loop import stop_reason, warmup
from operatorx.measure.stats import median_noise


def test_summarize_is_exact_on_known_samples():
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s["median"] == 3.0 and s["min"] == 1.0 and s["max"] == 100.0 and s["n"] == 5
    assert s["mean"] == pytest.approx(22.0)


def test_summarize_refuses_nothing():
    with pytest.raises(ValueError):
        summarize([])


def test_warmup_honours_calls_and_floor():
    calls = []
    n, secs, call_s = warmup(lambda: calls.append(1), lambda: None,
                             TimingSettings(warmup_calls=3, warmup_floor_s=0.02, first_warmup_floor_s=0.02))
    assert n == len(calls) >= 3 and secs >= 0.02 and 0 <= call_s < 0.005


def test_warmup_reports_the_median_call_after_the_first():
    """The first call pays lazy set-up; the later ones say how long a call takes."""
    times = iter([0.02, 0.002, 0.003, 0.002])

    def op() -> None:
        time.sleep(next(times))

    _, _, call_s = warmup(op, lambda: None, TimingSettings(warmup_calls=4, warmup_floor_s=0, first_warmup_floor_s=0))
    assert 0.002 <= call_s < 0.01          # not the first call's 20 ms (a loaded machine oversleeps 2 ms)


def test_a_rested_retry_warms_up_with_one_call_once_the_process_is_warm(monkeypatch):
    import operatorx.measure.loop as loop

    settings = TimingSettings(warmup_calls=5, warmup_floor_s=0, first_warmup_floor_s=0)
    monkeypatch.setattr(loop, "_process_warmed", False)
    assert warmup(lambda: None, lambda: None, settings, rest_s=0.001)[0] == 5     # a process's first op: all
    assert warmup(lambda: None, lambda: None, settings)[0] == 5
    assert warmup(lambda: None, lambda: None, settings, rest_s=0.001)[0] == 1


def test_the_first_op_of_a_process_rests_as_long_as_each_warmup_call(monkeypatch):
    """Its one-second floor brings an idle GPU's clocks up without driving it into the power cap."""
    import operatorx.measure.loop as loop

    slept: list[float] = []
    monkeypatch.setattr(loop.time, "sleep", slept.append)
    monkeypatch.setattr(loop, "_process_warmed", False)
    settings = TimingSettings(warmup_calls=3, warmup_floor_s=0, first_warmup_floor_s=0)
    calls, _, _ = warmup(lambda: sum(range(20_000)), lambda: None, settings)
    assert calls == 3 and len(slept) == 3 and all(s > 0 for s in slept)
    slept.clear()
    warmup(lambda: sum(range(20_000)), lambda: None, settings)       # later ops: back to back
    assert slept == []


def test_stop_rules():
    s = TimingSettings(min_samples=10, max_samples=40, noise_target=0.005, max_time_s=0.5, timeout_s=1.0)
    steady, noisy = [10.0] * 10, [10.0, 12.0] * 6
    assert stop_reason(steady[:5], 0.1, s) is None             # below min_samples, even if quiet
    assert stop_reason(steady, 0.1, s) == "noise_target"
    assert stop_reason(noisy, 0.1, s) is None                   # ±10%: keep sampling
    assert stop_reason(noisy, 0.6, s) == "time_cap"             # but not past the per-case cap
    assert stop_reason(noisy * 4, 0.1, s) == "max_samples"
    assert stop_reason(steady[:3], 0.6, s) is None              # the cap needs min_samples first
    assert stop_reason(steady[:3], 1.5, s) == "timeout"         # the timeout does not


def test_median_noise_is_the_order_statistic_interval():
    assert median_noise([5.0] * 20) == 0.0
    x = list(range(1, 11))                                       # n=10: the interval is x(2)..x(9)
    assert median_noise([float(v) for v in x]) == pytest.approx((9 - 2) / 2 / 5.5)
    assert median_noise([1.0]) == float("inf")
    rng = np.random.default_rng(0)
    few, many = rng.normal(100, 1, 20), rng.normal(100, 1, 2000)
    assert median_noise(many) < median_noise(few) / 5            # shrinks like 1/sqrt(n)
    assert summarize(few)["median_noise"] == pytest.approx(median_noise(few))


@pytest.mark.parametrize("bad", [{"min_samples": 0}, {"max_samples": 5, "min_samples": 10}, {"timeout_s": -1},
                                 {"mode": "nvbench"}, {"l2_state": "lukewarm"}, {"capped_clock_fraction": 0},
                                 {"noise_target": -0.1}])
def test_settings_refuse_nonsense(bad):
    with pytest.raises(ValueError):
        TimingSettings(**bad)


def test_host_clock_measures_a_known_sleep():
    settings = TimingSettings(warmup_calls=1, warmup_floor_s=0, first_warmup_floor_s=0, min_samples=10,
                              max_time_s=0)
    m = HostClockTiming(settings).measure(lambda: time.sleep(0.002))
    assert m.clock == "host" and len(m.samples_us) >= 10
    assert 1900 < m.latency_us < 6000


def test_retry_pauses_grow():
    s = TimingSettings()
    assert [s.pause_s(k, call_s=100e-6) for k in range(4)] == [0.0, 0.0005, 0.001, 0.002]
    assert [s.pause_s(k, call_s=5e-6) for k in range(4)] == [0.0] * 4        # a µs call: its cooldown only
    assert [s.cooldown_s(k) for k in range(4)] == [0.0, 0.05, 0.1, 0.2]
    assert s.rested_pause_s(0.0009) == 0.0 and s.rested_pause_s(0.002) == 0.002 and s.rested_pause_s(2.0) == 0.05
    assert [s.pause_s(k, call_s=0.017) for k in range(4)] == [0.0, 0.017, 0.034, 0.068]   # a long call: its own length
    assert [s.pause_s(k, call_s=1.0) for k in range(4)] == [0.0, 0.05, 0.1, 0.2]        # a seconds-long call: capped


def test_median_noise_is_unknown_below_the_sample_count_any_95pct_interval_needs():
    """With n <= 5 even [min, max] holds the median with less than 95% (1 - 2/2^n): a tight pair of
    samples must not read as a known median, or `--min-samples 2` would stop on luck."""
    from scipy.stats import binom

    for n in range(2, 6):
        assert median_noise([100.0 + 0.01 * i for i in range(n)]) == float("inf"), n
    assert median_noise([100.0 + 0.01 * i for i in range(6)]) == pytest.approx(0.05 / 2 / 100.025)
    for n in [*range(6, 300), 511, 1000, 1999, 2000]:        # x = 1..n: the noise names the interval's ranks
        x = np.arange(1.0, n + 1)
        j = round((n - 1 - 2 * median_noise(x) * np.median(x)) / 2)      # interval x[j]..x[n-1-j], 0-based
        assert 1 - 2 * binom.cdf(j, n, 0.5) >= 0.95 > 1 - 2 * binom.cdf(j + 1, n, 0.5), n    # holds 95%, tightest
    s = TimingSettings(min_samples=2, max_samples=100, max_time_s=10)
    assert stop_reason([100.0, 100.01], 0.1, s) is None
    assert median_noise([float("nan")] * 10) == float("inf")


def test_a_time_cap_longer_than_the_timeout_is_still_a_time_cap_once_min_samples_are_in():
    s = TimingSettings(min_samples=10, max_samples=100, max_time_s=float("inf"), timeout_s=30)
    noisy = [10.0, 12.0] * 6
    assert stop_reason(noisy, 29, s) is None
    assert stop_reason(noisy, 31, s) == "time_cap"               # not "timed out after 12 samples"
    assert stop_reason(noisy[:3], 31, s) == "timeout"


@pytest.mark.parametrize("name", ["noise_target", "max_time_s", "timeout_s", "throttle_pause_s"])
def test_settings_refuse_nan(name):
    with pytest.raises(ValueError, match=f"timing.{name}.*nan"):
        TimingSettings(**{name: float("nan")})
