"""Which attempt a capped case keeps, with a fake timer and a fake sampler (CPU)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import operatorx.measure.retry as retry
from operatorx.measure import Measurement, NotMeasurable, TimingSettings, summarize
from operatorx.measure.record import TimerRecord

RECORD = TimerRecord(l2_state="warm", spin=False)
"""What the fake timers saw: nothing but their settings (no pause, no telemetry window)."""


def _paused(m, pause_s):
    """`m` as a timer that made `pause_s` after each call reports it."""
    return replace(m, details=m.details.model_copy(update={"pause_s": pause_s}))

SETTINGS = TimingSettings(throttle_retries=3, throttle_pause_s=0.002, throttle_cooldown_s=0.0,
                          unpaused_retry_below_s=0.0, rested_call_s=0.0)


class _Timer:
    """Attempt k reads `latencies[k]` µs and was capped when `capped[k]`; `None` as a latency makes
    that attempt raise."""

    def __init__(self, latencies, capped, honours_give_up=False):
        self.latencies, self.capped, self.pauses = list(latencies), list(capped), []
        self.asked: list[bool] = []             # whether each attempt was given a way to stop early
        self.honours_give_up = honours_give_up

    def measure(self, fn, pause_s=0.0, give_up=None):
        self.pauses.append(pause_s)
        self.asked.append(give_up is not None)
        latency = self.latencies[len(self.pauses) - 1]
        if latency is None:
            raise NotMeasurable("every call was starved (planted)")
        if self.honours_give_up and give_up is not None and give_up(0.0):
            samples = [latency] * 3             # cut short after its first batch
            return Measurement("fake", "device", samples, summarize(samples), 0, 0.0, "capped", RECORD)
        samples = [latency] * 10
        return Measurement("fake", "device", samples, summarize(samples), 0, 0.0, "noise_target", RECORD)


def _sampler(timer, capped_at_end, cut):
    """A sampler class for attempt k (the timer's attempt count when it is made): its window's final
    verdict is `capped_at_end(k)`, and `cut(k)` is what it tells the timer while it runs."""

    class Sampler:
        def __init__(self, *args):
            self.k = len(timer.pauses) if timer is not None else 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def summary(self, since_s=None):
            c = capped_at_end(self.k)
            return {"available": True, "capped": c, "capping_reasons": ["sw_power_cap"] if c else []}

        def capped_since(self, since_s):
            return cut(self.k)

    return Sampler


_AlwaysCapped = _sampler(None, lambda k: True, lambda k: True)
"""A sampler whose every reading shows the cap."""


def _run(monkeypatch, latencies, capped, honours_give_up=False):
    timer = _Timer(latencies, capped, honours_give_up)

    sampler = _sampler(timer, lambda k: timer.capped[k], lambda k: timer.capped[k])

    monkeypatch.setattr(retry, "TelemetrySampler", sampler)
    return retry.measure_with_retries(timer, lambda: None, None, SETTINGS), timer   # type: ignore[arg-type]


def test_an_uncapped_first_attempt_is_the_only_one(monkeypatch):
    done, timer = _run(monkeypatch, [10.0], [False])
    assert done.measurement.latency_us == 10.0 and not done.telemetry["capped"] and len(done.attempts) == 1
    assert timer.pauses == [0.0]


def test_the_uncapped_retry_is_kept_even_when_a_capped_attempt_read_faster(monkeypatch):
    done, timer = _run(monkeypatch, [9.0, 11.0], [True, False])
    assert done.measurement.latency_us == 11.0 and not done.telemetry["capped"]
    assert [a["kept"] for a in done.attempts] == [False, True] and timer.pauses == [0.0, 0.002]


def test_all_capped_keeps_the_fastest_and_says_capped(monkeypatch):
    done, timer = _run(monkeypatch, [12.0, 10.0, 11.0, 13.0], [True] * 4)
    assert done.measurement.latency_us == 10.0 and done.telemetry["capped"] and len(done.attempts) == 4
    assert timer.pauses == [0.0, 0.002, 0.004, 0.008]


def test_a_retry_that_fails_keeps_the_attempts_before_it_and_records_the_failure(monkeypatch):
    done, _ = _run(monkeypatch, [12.0, None], [True, False])
    assert done.measurement.latency_us == 12.0 and done.telemetry["capped"]
    assert done.attempts[0]["kept"] and "starved (planted)" in done.attempts[1]["error"]


def test_a_first_attempt_that_fails_is_the_case_failure(monkeypatch):
    with pytest.raises(NotMeasurable):
        _run(monkeypatch, [None], [False])


def test_two_paused_attempts_that_agree_end_the_retries_and_the_kept_one_stays_flagged(monkeypatch):
    """A GEMM that holds the power cap by itself: more rest moved it 0.0-0.4% on the H200."""
    done, timer = _run(monkeypatch, [21_776.0, 19_350.0, 19_300.0, 19_227.0], [True] * 4)
    assert len(done.attempts) == 3 and timer.pauses == [0.0, 0.021776, 0.043552]   # paused as long as the call
    assert done.measurement.latency_us == 19_300.0 and done.telemetry["capped"]
    assert [a["converged"] for a in done.attempts] == [False, False, True]


def test_paused_attempts_still_moving_go_on_retrying(monkeypatch):
    done, _ = _run(monkeypatch, [12.0, 11.0, 10.0, 9.5], [True] * 4)
    assert len(done.attempts) == 4 and not any(a["converged"] for a in done.attempts)


def test_attempts_too_short_to_know_their_noise_do_not_count_as_converged(monkeypatch):
    """Five samples give no confidence interval (noise inf): that is no licence to stop retrying."""
    timer = _Timer([12.0, 11.0, 10.0, 9.5], [True] * 4)

    def five(fn, pause_s=0.0, give_up=None):
        timer.pauses.append(pause_s)
        samples = [timer.latencies[len(timer.pauses) - 1]] * 5
        return Measurement("fake", "device", samples, summarize(samples), 0, 0.0, "timeout", RECORD)

    monkeypatch.setattr(timer, "measure", five)

    monkeypatch.setattr(retry, "TelemetrySampler", _AlwaysCapped)
    done = retry.measure_with_retries(timer, lambda: None, None, SETTINGS)   # type: ignore[arg-type]
    assert len(done.attempts) == 4 and not any(a["converged"] for a in done.attempts)


def test_every_attempt_but_the_last_may_stop_early_once_capped(monkeypatch):
    """A capped attempt's number is not kept when a retry follows, so sampling it to the end
    (up to max_time_s) is wasted; the last attempt has no retry after it and always runs in full."""
    done, timer = _run(monkeypatch, [21_776.0, 19_350.0, 19_000.0, 19_227.0], [True] * 4, honours_give_up=True)
    assert timer.asked == [True, True, True, False]
    assert [a["stop_reason"] for a in done.attempts] == ["capped"] * 3 + ["noise_target"]
    assert [a["kept"] for a in done.attempts] == [False, False, False, True]     # the full one, not the fastest
    assert done.measurement.latency_us == 19_227.0 and done.telemetry["capped"]


def test_a_cut_short_attempt_is_kept_only_when_no_full_one_exists(monkeypatch):
    done, _ = _run(monkeypatch, [12.0, None], [True, False], honours_give_up=True)
    assert done.attempts[0]["kept"] and done.attempts[0]["stop_reason"] == "capped"
    assert done.measurement.latency_us == 12.0 and "starved (planted)" in done.attempts[1]["error"]


def test_an_uncapped_retry_after_a_cut_short_attempt_ends_the_retries(monkeypatch):
    done, timer = _run(monkeypatch, [9.0, 11.0], [True, False], honours_give_up=True)
    assert len(done.attempts) == 2 and done.measurement.latency_us == 11.0 and not done.telemetry["capped"]
    assert timer.pauses == [0.0, 0.002]


def test_each_retry_first_rests_the_gpu_for_its_cooldown(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(retry.time, "sleep", slept.append)
    timer = _Timer([12.0, 11.0, 10.0, 9.5], [True] * 4)

    monkeypatch.setattr(retry, "TelemetrySampler", _AlwaysCapped)
    retry.measure_with_retries(timer, lambda: None, None, TimingSettings(throttle_retries=3))  # type: ignore[arg-type]
    assert slept == [0.05, 0.1, 0.2]
    assert timer.pauses == [0.0] * 4        # a 12 µs call cannot hold the cap by itself: rested by the cooldown only
    slept.clear()
    timer = _Timer([120.0, 110.0, 100.0, 95.0], [True] * 4)
    retry.measure_with_retries(timer, lambda: None, None, TimingSettings(throttle_retries=3))  # type: ignore[arg-type]
    assert slept == [0.05, 0.1, 0.2] and timer.pauses == [0.0, 0.0005, 0.001, 0.002]


class _RestedTimer(_Timer):
    """A long call: the timer rests it from the first attempt on its own (pause in the details)."""

    def measure(self, fn, pause_s=0.0, give_up=None):
        return _paused(super().measure(fn, pause_s, give_up), pause_s or self.latencies[0] * 1e-6)


def test_a_call_rested_from_its_first_attempt_doubles_its_pause_and_two_rested_attempts_can_converge(monkeypatch):
    """The first attempt already rested (settings.rested_call_s): the retry rests twice as long, and
    when the two agree the retries end, the kept number flagged capped as before."""
    timer = _RestedTimer([19_614.0, 19_655.0, 19_500.0, 19_400.0], [True] * 4)
    monkeypatch.setattr(retry, "TelemetrySampler", _sampler(timer, lambda k: True, lambda k: False))
    done = retry.measure_with_retries(timer, lambda: None, None, SETTINGS)   # type: ignore[arg-type]
    assert timer.pauses == [0.0, pytest.approx(2 * 0.019614)]
    assert [a["pause_s"] for a in done.attempts] == [pytest.approx(0.019614), pytest.approx(2 * 0.019614)]
    assert [a["converged"] for a in done.attempts] == [False, True] and done.telemetry["capped"]
    assert done.measurement.latency_us == 19_614.0


def test_two_cut_short_retries_that_agree_do_not_end_the_retries(monkeypatch):
    """Cut-short attempts hold a few samples each: their agreement is no reason to stop, and stopping
    there would keep no full attempt. The last attempt (never cut short) runs and is kept."""
    done, timer = _run(monkeypatch, [21_776.0, 19_350.0, 19_340.0, 19_227.0], [True] * 4, honours_give_up=True)
    assert len(done.attempts) == 4 and not any(a["converged"] for a in done.attempts)
    assert [a["stop_reason"] for a in done.attempts] == ["capped"] * 3 + ["noise_target"]
    assert done.measurement.latency_us == 19_227.0 and done.measurement.stop_reason == "noise_target"


def test_a_cut_short_attempt_is_retried_even_when_its_window_reads_uncapped_after_the_cut(monkeypatch):
    """The timer stopped for the cap, then one more uncapped reading brought the window's share under
    10%: the attempt still counts as capped and a full one follows."""
    timer = _Timer([12.0, 11.0], [False, False], honours_give_up=True)

    cut_then_clean = _sampler(timer, lambda k: False, lambda k: k == 0)
    monkeypatch.setattr(retry, "TelemetrySampler", cut_then_clean)
    done = retry.measure_with_retries(timer, lambda: None, None, SETTINGS)   # type: ignore[arg-type]
    assert [a["stop_reason"] for a in done.attempts] == ["capped", "noise_target"]
    assert done.measurement.latency_us == 11.0


def test_a_cut_short_attempt_that_holds_min_samples_can_converge_and_counts_as_full(monkeypatch):
    """A 19 ms GEMM's attempts hold 10 calls (min_samples) whether cut or not: a rested first attempt
    and a cut-short retry that agree end the retries, and the faster of the two is kept."""
    timer = _RestedTimer([18_809.6, 18_802.4, 18_771.1, 18_807.1], [True] * 4)
    ten_then_cut = _sampler(timer, lambda k: True, lambda k: k >= 1)

    def measure(fn, pause_s=0.0, give_up=None):
        m = _RestedTimer.measure(timer, fn, pause_s, None)
        if give_up is not None and give_up(0.0):
            m = Measurement("fake", "device", m.samples_us, m.summary, 0, 0.0, "capped", details=m.details)
        return m

    monkeypatch.setattr(timer, "measure", measure)
    monkeypatch.setattr(retry, "TelemetrySampler", ten_then_cut)
    done = retry.measure_with_retries(timer, lambda: None, None, SETTINGS)   # type: ignore[arg-type]
    assert [a["stop_reason"] for a in done.attempts] == ["noise_target", "capped"]
    assert [a["converged"] for a in done.attempts] == [False, True] and done.attempts[1]["kept"]
    assert done.measurement.latency_us == 18_802.4


def _cut_after(timer, samples_of):
    """The timer's measure, cut short (stop reason `capped`) with `samples_of(k)` samples when the
    sampler asks it to give up."""
    base = type(timer).measure

    def measure(fn, pause_s=0.0, give_up=None):
        m = base(timer, fn, pause_s, None)
        if give_up is not None and give_up(0.0):
            samples = m.samples_us[:1] * samples_of(len(timer.pauses) - 1)
            m = Measurement("fake", "device", samples, summarize(samples), 0, 0.0, "capped", details=m.details)
        return m
    return measure


def test_converged_cut_short_retries_are_chosen_over_an_unrested_capped_attempt(monkeypatch):
    """A 200 µs GEMM: its unrested first attempt ran full and capped (210 µs); two retries cut short
    after 32 samples each agree (200, 200.5). The retries end, and the number is a rested one."""
    timer = _Timer([210.0, 200.0, 200.5, 199.0], [True] * 4)
    monkeypatch.setattr(timer, "measure", _cut_after(timer, lambda k: 32))
    monkeypatch.setattr(retry, "TelemetrySampler", _sampler(timer, lambda k: True, lambda k: k >= 1))
    done = retry.measure_with_retries(timer, lambda: None, None, SETTINGS)   # type: ignore[arg-type]
    assert [a["stop_reason"] for a in done.attempts] == ["noise_target", "capped", "capped"]
    assert done.measurement.latency_us == 200.0 and done.attempts[-1]["converged"]


def test_a_us_calls_unpaused_retries_do_not_converge(monkeypatch):
    """Under 50 µs a retry makes no pause (its cooldown is its rest). Two such retries that agree while
    capped mean an earlier case's cap still holds: the next, longer cooldown runs instead of stopping."""
    timer = _Timer([12.0, 11.0, 11.02, 10.0], [True, True, True, False])
    monkeypatch.setattr(retry, "TelemetrySampler", _sampler(timer, lambda k: timer.capped[k], lambda k: False))
    done = retry.measure_with_retries(timer, lambda: None, None, TimingSettings(throttle_retries=3,
                                                                                 throttle_cooldown_s=0.0))
    assert timer.pauses == [0.0] * 4 and not any(a["converged"] for a in done.attempts)
    assert done.measurement.latency_us == 10.0 and not done.telemetry["capped"]


def test_a_cut_short_attempt_is_never_the_uncapped_one_kept(monkeypatch):
    """Cut for the cap, then one more uncapped reading made its window read uncapped: a full uncapped
    retry is kept over it, though the cut one read faster."""
    timer = _Timer([210.0, 199.0, 201.0], [True, False, False])
    monkeypatch.setattr(timer, "measure", _cut_after(timer, lambda k: 32))
    monkeypatch.setattr(retry, "TelemetrySampler", _sampler(timer, lambda k: k == 0, lambda k: k == 1))
    done = retry.measure_with_retries(timer, lambda: None, None, SETTINGS)   # type: ignore[arg-type]
    assert [a["stop_reason"] for a in done.attempts] == ["noise_target", "capped", "noise_target"]
    assert done.measurement.latency_us == 201.0 and not done.telemetry["capped"]


def test_doubling_a_rested_first_attempts_pause_stops_at_the_settings_ceiling(monkeypatch):
    """A 1 s call rests 50 ms from its first attempt; its retries rest 100, 200, 200 ms (the ceiling
    of the settings' own schedule, 200 ms with 3 retries, not 400)."""
    timer = _RestedTimer([1e6, 0.99e6, 0.98e6, 0.97e6], [True] * 4)
    timer.latencies[0] = 1e6
    monkeypatch.setattr(retry, "TelemetrySampler", _AlwaysCapped)

    def measure(fn, pause_s=0.0, give_up=None):
        m = _RestedTimer.measure(timer, fn, pause_s, None)
        return _paused(m, pause_s or 0.05)                # the timer rests a 1 s call 50 ms

    monkeypatch.setattr(timer, "measure", measure)
    retry.measure_with_retries(timer, lambda: None, None, TimingSettings(throttle_retries=3,
                                                                          throttle_cooldown_s=0.0))
    assert timer.pauses == [0.0, 0.1, 0.2, 0.2]


def test_cut_short_retries_whose_medians_are_known_can_converge(monkeypatch):
    """The H200's 32768x32320x7168 bf16 GEMM: rested, every attempt capped and cut after 9 calls
    (min_samples 10), medians 19,369 / 19,269 / 19,314 µs, each known to ~0.1%. Retries 1 and 2
    agree: the fourth attempt is not run. Three calls (no interval) still say too little."""
    timer = _RestedTimer([19_369.6, 19_269.3, 19_314.4, 19_353.9], [True] * 4)

    def nine_calls(k):
        return [timer.latencies[k] * (1 + 0.001 * (i % 3 - 1)) for i in range(9)]

    def measure(fn, pause_s=0.0, give_up=None):
        m = _RestedTimer.measure(timer, fn, pause_s, None)
        if give_up is not None and give_up(0.0):
            samples = nine_calls(len(timer.pauses) - 1)
            m = Measurement("fake", "device", samples, summarize(samples), 0, 0.0, "capped", details=m.details)
        return m

    monkeypatch.setattr(timer, "measure", measure)
    monkeypatch.setattr(retry, "TelemetrySampler", _sampler(timer, lambda k: True, lambda k: True))
    done = retry.measure_with_retries(timer, lambda: None, None, SETTINGS)   # type: ignore[arg-type]
    assert [a["stop_reason"] for a in done.attempts] == ["capped"] * 3
    assert [a["converged"] for a in done.attempts] == [False, False, True] and done.telemetry["capped"]
    assert done.measurement.latency_us == pytest.approx(19_269.3)
    assert 0 < done.measurement.summary["median_noise"] <= retry.CONVERGED_REL


def test_converged_cut_short_retries_are_kept_over_a_full_unrested_capped_attempt(monkeypatch):
    """A full first attempt read 21,000 µs capped; retries 1 and 2 were cut after 9 calls but their
    medians are known and agree (19,370, 19,314): the retries end, and the number is theirs."""
    timer = _Timer([21_000.0, 19_370.0, 19_314.0, 19_300.0], [True] * 4)

    def measure(fn, pause_s=0.0, give_up=None):
        m = _Timer.measure(timer, fn, pause_s, None)
        if give_up is not None and give_up(0.0):
            k = len(timer.pauses) - 1
            samples = [timer.latencies[k] * (1 + 0.001 * (i % 3 - 1)) for i in range(9)]
            m = Measurement("fake", "device", samples, summarize(samples), 0, 0.0, "capped", details=m.details)
        return m

    monkeypatch.setattr(timer, "measure", measure)
    monkeypatch.setattr(retry, "TelemetrySampler", _sampler(timer, lambda k: True, lambda k: k >= 1))
    done = retry.measure_with_retries(timer, lambda: None, None, SETTINGS)   # type: ignore[arg-type]
    assert [a["stop_reason"] for a in done.attempts] == ["noise_target", "capped", "capped"]
    assert done.attempts[-1]["converged"] and done.measurement.latency_us == pytest.approx(19_314.0)
