"""KernelTiming's sampling loop on the CPU, with scripted trace batches in place of CUPTI.

The GPU tests (test_kernel_timing.py) show the timer against real kernels; these pin the loop's
own rules: starved calls dropped and counted, an op that starves every call kept with its gaps,
empty batches, the stop rule, and the timed-window start the telemetry filter relies on.
"""

from __future__ import annotations

import time

import pytest

from operatorx.measure import NotMeasurable, TimingSettings
from operatorx.measure import kernel_timing as kt
from operatorx.measure.l2 import L2Flusher
from operatorx.measure.trace import STARVED_GAP_NS, Activity, CallTrace, TraceBatch


def _call(span_ns: int, gap_ns: int = 500) -> CallTrace:
    c = CallTrace([Activity("k", 1_000, 1_000 + span_ns, 7)], gap_before_ns=gap_ns)
    c.max_gap_ns = gap_ns
    return c


@pytest.fixture
def scripted(monkeypatch):
    """Replace the profiled batch with a script: each entry makes the calls of one batch."""
    import torch

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(kt, "_profiler_ready", True)
    seen: list[int] = []
    spins: list[int] = []

    pause_spins: list[int] = []
    released: list[bool] = []
    monkeypatch.setattr(kt, "host_release", lambda: None)      # the fixed spin, unless a test says otherwise

    def install(make_calls, queue_left=None):
        def fake_trace_batch(call, n, flush, spin_cycles, pause_s=0.0, pause_spin_cycles=0, released=False):
            seen.append(n)
            spins.append(spin_cycles)
            pause_spins.append(pause_spin_cycles)
            install.released.append(released)
            held_s = min(spin_cycles / 2e9, n * 50e-6) if released else spin_cycles / 2e9
            left = queue_left(held_s, n) if queue_left is not None else None
            return TraceBatch(calls=make_calls(len(seen), n), harness_activities=2 * n, unattributed=0,
                              enqueue_s_per_call=50e-6, queue_left_ns=None if left is None else int(left * 1e9))
        monkeypatch.setattr(kt, "trace_batch", fake_trace_batch)
        install.spins = spins
        install.pause_spins = pause_spins
        install.released = released
        return seen
    return install


def _timer(**kw) -> kt.KernelTiming:
    s = TimingSettings(**{"warmup_calls": 1, "warmup_floor_s": 0, "first_warmup_floor_s": 0, **kw})
    return kt.KernelTiming(s, L2Flusher("warm", None), sm_clock_hz=2e9)


def test_steady_calls_stop_on_the_noise_target_after_one_batch(scripted):
    seen = scripted(lambda b, n: [_call(10_000) for _ in range(n)])
    t0 = time.perf_counter()
    m = _timer().measure(lambda: None)
    assert m.stop_reason == "noise_target" and m.latency_us == 10.0 and seen == [32]
    assert m.details.window_start_s >= t0 and m.details.starved_calls_dropped == 0
    assert m.details.activity_forced_flushes == 0


def test_batches_that_needed_the_forced_flush_are_counted(scripted, monkeypatch):
    scripted(lambda b, n: [_call(10_000) for _ in range(n)])
    scripted_batch = kt.trace_batch

    def forced(*args, **kwargs):
        import dataclasses

        return dataclasses.replace(scripted_batch(*args, **kwargs), forced_flush=True)

    monkeypatch.setattr(kt, "trace_batch", forced)
    m = _timer().measure(lambda: None)
    assert m.details.batches == 1 and m.details.activity_forced_flushes == 1


def test_starved_calls_are_dropped_counted_and_grow_the_spin(scripted):
    starved = STARVED_GAP_NS + 1
    scripted(lambda b, n: [_call(10_000, starved if i % 4 == 0 else 500) for i in range(n)])
    m = _timer().measure(lambda: None)
    assert m.latency_us == 10.0 and m.details.starved_calls_dropped == 8
    assert m.details.spin_short_batches == 1 and not m.details.host_gaps_included


def test_an_op_that_starves_every_call_is_kept_with_its_gaps_after_three_batches(scripted):
    seen = scripted(lambda b, n: [_call(50_000, STARVED_GAP_NS * 3) for _ in range(n)])
    m = _timer().measure(lambda: None)
    assert m.details.host_gaps_included is True and m.latency_us == 50.0
    assert m.details.starved_calls_dropped == 64 and m.details.starved_calls_kept == 32
    assert len(seen) == 3


def test_three_empty_batches_in_a_row_are_not_measurable_but_one_is_not_enough(scripted):
    scripted(lambda b, n: [CallTrace() for _ in range(n)] if b == 1 else [_call(10_000) for _ in range(n)])
    assert _timer().measure(lambda: None).latency_us == 10.0
    scripted(lambda b, n: [CallTrace() for _ in range(n)])
    with pytest.raises(NotMeasurable, match="no device work"):
        _timer().measure(lambda: None)


def test_noisy_calls_ask_for_a_bigger_next_batch_and_stop_at_the_time_cap(scripted):
    import itertools

    spread = itertools.cycle([9_000, 10_000, 11_000, 12_000])
    seen = scripted(lambda b, n: [_call(next(spread)) for _ in range(n)])
    m = _timer(max_time_s=0.0).measure(lambda: None)
    assert m.stop_reason == "time_cap" and seen == [32]
    seen.clear()
    m = _timer(max_time_s=0.05, max_samples=300).measure(lambda: None)
    assert seen[1] > 32 and m.stop_reason in ("time_cap", "max_samples")


def test_a_long_call_starts_with_min_samples_and_no_batch_overruns_the_cap():
    s = TimingSettings(min_samples=10, batch_size=32, max_time_s=1.0)
    assert kt._first_batch(s, call_s=20e-6) == 32              # µs calls: the whole batch
    assert kt._first_batch(s, call_s=0.017) == 10              # a 17 ms GEMM: min_samples, not 32
    noisy = [10.0, 11.0, 12.0, 10.5, 13.0, 9.0, 10.0, 12.5, 11.5, 10.2]
    assert kt._next_batch(noisy, s, 10, call_s=0.017, left_s=0.2) == 11      # 0.2 s left / 17 ms
    assert kt._next_batch(noisy, s, 10, call_s=0.017, left_s=0.9) == 14      # at most 0.25 s a batch
    assert kt._next_batch(noisy, s, 10, call_s=0.017, left_s=0.001) == 1     # never zero
    assert kt._next_batch(noisy, s, 10, call_s=20e-6, left_s=0.5) == 512     # noise asks for many: the cap
    assert kt._first_batch(TimingSettings(timeout_s=30.0), call_s=5.0) == 6   # 5 s calls: what fits in the timeout
    assert kt._first_batch(TimingSettings(timeout_s=30.0), call_s=60.0) == 1  # never fewer than one


def test_a_capped_attempt_stops_after_the_batch_that_showed_it(scripted):
    """measure/retry.py asks each batch whether the telemetry already shows the attempt capped."""
    seen = scripted(lambda b, n: [_call(10_000 + 1_000 * b + 37 * i) for i in range(n)])   # would go on
    asked: list[float] = []

    def give_up(window_start_s: float) -> bool:
        asked.append(window_start_s)
        return len(asked) >= 2

    m = _timer(noise_target=1e-6).measure(lambda: None, give_up=give_up)
    assert m.stop_reason == "capped" and len(seen) == 2 and asked == [m.details.window_start_s] * 2


def test_a_rested_attempt_rests_after_each_warmup_call_too(scripted, monkeypatch):
    """Back-to-back warmup calls of a long GEMM would bring the cap back before the rested calls."""
    scripted(lambda b, n: [_call(10_000) for _ in range(n)])
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    _timer().measure(lambda: None, pause_s=0.004)
    assert slept[0] == 0.004                        # the one warmup call's rest, before any timed call's


def test_the_first_spin_is_sized_from_the_warmup_iterations_own_enqueue_time(scripted):
    """No extra iterations are run to time the enqueue: the warmup's [flush, call] host times
    (the first left out) give it, half again for the range marks, times the batch and the margin."""
    seen = scripted(lambda b, n: [_call(10_000) for _ in range(n)])
    first = [True]

    def op() -> None:
        time.sleep(0.02 if first[0] else 0.002)       # the first call pays lazy set-up
        first[0] = False

    _timer(warmup_calls=4, rested_call_s=0).measure(op)     # (a 2 ms call would otherwise be timed rested)
    spin_s = scripted.spins[0] / 2e9                    # the timer's clock: 2 GHz
    expected_s = kt._SPIN_MARGIN * 1.5 * 0.002 * seen[0]
    assert 0.95 * expected_s <= spin_s <= 3 * expected_s, spin_s      # (sleeps overshoot on a loaded machine;
    # the 300 µs guess would read 0.1 x)


def test_a_long_call_is_timed_rested_from_the_first_attempt_its_warmup_included(scripted, monkeypatch):
    """A call of `rested_call_s` or more rests as long as itself after each warmup call and each timed
    call, unasked: on the H200 every GEMM from ~1 ms up capped its first, unrested attempt."""
    scripted(lambda b, n: [_call(3_000_000) for _ in range(n)])
    slept: list[float] = []
    real_sleep = time.sleep

    def op() -> None:
        real_sleep(0.003)

    monkeypatch.setattr(time, "sleep", slept.append)
    m = _timer(warmup_calls=3, rested_call_s=0.002).measure(op)
    assert len(slept) == 3                         # after each warmup call
    assert all(0.003 <= s < 0.03 for s in slept), slept
    assert 0.003 <= m.details.pause_s < 0.03
    assert _timer(warmup_calls=3, rested_call_s=0.05).measure(op).details.pause_s == 0.0    # shorter: batched


def test_a_rested_attempts_head_start_per_call_is_sized_from_its_warmup(scripted, monkeypatch):
    """Each call of a rested attempt gets its own short spin: twice the host's enqueue time (as the
    warmup measured it, half again for the range marks) plus 200 µs, not a 300 µs guess (an op that
    takes 1 ms to enqueue would starve every call on the guess)."""
    scripted(lambda b, n: [_call(3_000_000) for _ in range(n)])
    monkeypatch.setattr(time, "sleep", lambda s: None)
    t = {"now": 0.0}
    monkeypatch.setattr(time, "perf_counter", lambda: t["now"])

    def op() -> None:           # 1 ms of host time a call, by the timer's own clock
        t["now"] += 0.001

    _timer(warmup_calls=3, rested_call_s=0.0005).measure(op)
    expected_s = 2 * 1.5 * 0.001 + kt._PAUSE_SPIN_S
    assert scripted.pause_spins[0] / 2e9 == pytest.approx(expected_s, rel=1e-6)


def test_the_spin_is_trimmed_to_what_the_host_lags_behind_the_gpu_plus_a_few_calls(scripted):
    """Host 50 µs a call, GPU 30 µs (a µs GEMM behind its flush): after the first batch the spin
    covers n x 20 µs plus 8 calls' enqueue, not 1.2 x n x 50 µs; a starved batch undoes the trim."""
    import itertools

    spread = itertools.cycle([9_000, 10_000, 11_000, 12_000])      # noisy: several batches
    host_s, gpu_s = 50e-6, 30e-6
    seen = scripted(lambda b, n: [_call(next(spread)) for _ in range(n)],
                    queue_left=lambda spin_s, n: spin_s + n * gpu_s - n * host_s)
    _timer(max_time_s=0.05, max_samples=600, rested_call_s=0).measure(lambda: None)
    spins_s = [c / 2e9 for c in scripted.spins]
    assert len(seen) >= 2
    for n, spin_s in zip(seen[1:], spins_s[1:], strict=True):
        assert spin_s == pytest.approx(kt._QUEUE_LEFT_CALLS * 50e-6 + n * (host_s - gpu_s), rel=1e-3)
        if n >= 64:                 # (a batch cut short by the time cap is mostly the 8 calls kept queued)
            assert spin_s < 0.6 * kt._SPIN_MARGIN * 50e-6 * n


def test_a_multi_kernel_call_keeps_the_whole_spin(scripted):
    """Calls of several kernels are fully queued behind the spin (1.2 x the host's enqueue of the
    batch): launching them while the GPU runs them would grow the gaps between their kernels."""
    import itertools

    spread = itertools.cycle([9_000, 10_000, 11_000, 12_000])

    def two_kernels(b, n):
        calls = []
        for _ in range(n):
            span = next(spread)
            c = CallTrace([Activity("quant", 1_000, 2_000, 7), Activity("gemm", 3_000, 1_000 + span, 8)],
                          gap_before_ns=500)
            c.max_gap_ns = 1_000
            calls.append(c)
        return calls

    seen = scripted(two_kernels, queue_left=lambda spin_s, n: spin_s + n * 30e-6 - n * 50e-6)
    _timer(max_time_s=0.05, max_samples=600, rested_call_s=0).measure(lambda: None)
    assert len(seen) >= 2
    for n, cycles in zip(seen[1:], scripted.spins[1:], strict=True):
        assert cycles / 2e9 == pytest.approx(kt._SPIN_MARGIN * 50e-6 * n, rel=1e-3)


def test_one_warmup_call_gives_no_enqueue_estimate():
    """A retry's single warmup call holds its lazy set-up: the first spin falls back to the guess."""
    assert kt._enqueue_from_warmup([0.2]) == kt._FIRST_ENQUEUE_GUESS_S
    assert kt._enqueue_from_warmup([]) == kt._FIRST_ENQUEUE_GUESS_S
    assert kt._enqueue_from_warmup([0.2, 1e-4, 3e-4, 2e-4]) == pytest.approx(1.5 * 2e-4)


def _kernels(count: int, gap_ns: int = 500) -> CallTrace:
    """One call of `count` back-to-back 1 µs kernels (the last starts after `gap_ns` when starved)."""
    acts = [Activity("k", 1_000 * i, 1_000 * (i + 1), 7) for i in range(count)]
    c = CallTrace(acts, gap_before_ns=500)
    c.max_gap_ns = gap_ns
    return c


def test_a_batch_never_holds_more_launches_than_the_queue_takes(scripted):
    """10 kernels a call + the flush's 2: the noise asks for 512 calls, the queue takes 68 of them."""
    import itertools

    noisy = itertools.cycle([9_000, 10_000, 11_000, 12_000])

    def calls(b: int, n: int) -> list[CallTrace]:
        out = []
        for _ in range(n):
            c = _kernels(10)
            c.activities[-1] = Activity("k", 9_000, 9_000 + next(noisy), 7)
            out.append(c)
        return out

    seen = scripted(calls)
    m = _timer(max_time_s=0.05, max_samples=400).measure(lambda: None)
    expected = int(kt._QUEUE_FILL * kt.LAUNCH_QUEUE_DEPTH / 12)
    assert kt.queue_calls(12.0) == expected == 68
    assert seen[0] == 32 and seen[1:] and max(seen[1:]) == expected
    assert m.details.queue_max_calls == expected and m.details.queue_overflow_batches == 0


def test_an_overflowing_batch_neither_doubles_the_spin_nor_feeds_its_blocked_enqueue_time(scripted):
    """40 kernels a call: 32 calls overflow the queue and the tail starves. That is the queue's depth,
    not a short spin: the next batch is smaller, its spin is sized from the earlier enqueue time."""
    starved = STARVED_GAP_NS + 1
    seen = scripted(lambda b, n: [_kernels(40, starved if (b == 1 and i >= 20) else 500) for i in range(n)])
    m = _timer(min_samples=30, max_samples=60).measure(lambda: None)     # 20 kept: one batch more
    assert seen[0] == 32 and seen[1] == kt.queue_calls(42.0) == 19
    assert m.details.queue_overflow_batches == 1 and m.details.spin_short_batches == 0
    assert m.details.starved_calls_dropped == 12
    first, second = scripted.spins[0] / seen[0], scripted.spins[1] / seen[1]
    assert second == pytest.approx(first, rel=0.02)         # per call: not doubled, not the blocked host's time


def _two_kernel_calls(n: int) -> list[CallTrace]:
    import itertools

    spread = itertools.cycle([9_000, 10_000, 11_000, 12_000])
    calls = []
    for _ in range(n):
        c = CallTrace([Activity("quant", 1_000, 2_000, 7), Activity("gemm", 3_000, 1_000 + next(spread), 8)],
                      gap_before_ns=500)
        c.max_gap_ns = 1_000
        calls.append(c)
    return calls


def test_an_untrimmed_spin_waits_for_the_host_and_counts_only_what_it_waited(scripted, monkeypatch):
    """With the host-released wait available, every batch of a multi-kernel call is released
    (its spin is never trimmed), its budget still the fixed spin's length, and the GPU time
    counted for it is the host's enqueue time of the batch (50 µs a call here), not the budget."""
    monkeypatch.setattr(kt, "host_release", lambda: object())
    seen = scripted(lambda b, n: _two_kernel_calls(n), queue_left=lambda held_s, n: n * 30e-6)
    m = _timer(max_time_s=0.05, max_samples=600, rested_call_s=0).measure(lambda: None)
    assert len(seen) >= 2 and all(scripted.released)
    for n, cycles in zip(seen[1:], scripted.spins[1:], strict=True):
        assert cycles / 2e9 == pytest.approx(kt._SPIN_MARGIN * 50e-6 * n, rel=1e-3)
    t = m.details
    assert t.spin_released_batches == len(seen)
    assert t.phases.spin_gpu_s == pytest.approx(sum(seen) * 50e-6, rel=1e-6)


def test_a_single_kernel_call_is_released_only_until_its_spin_can_be_trimmed(scripted, monkeypatch):
    """The first batch waits for the host; from then on the spin is trimmed to the host's lag
    (sized from what the released wait really held: n x 50 µs), which lets the GPU start early."""
    import itertools

    monkeypatch.setattr(kt, "host_release", lambda: object())
    spread = itertools.cycle([9_000, 10_000, 11_000, 12_000])
    host_s, gpu_s = 50e-6, 30e-6
    seen = scripted(lambda b, n: [_call(next(spread)) for _ in range(n)],
                    queue_left=lambda held_s, n: held_s + n * gpu_s - n * host_s)
    m = _timer(max_time_s=0.05, max_samples=600, rested_call_s=0).measure(lambda: None)
    assert len(seen) >= 2
    assert scripted.released == [True] + [False] * (len(seen) - 1)
    for n, spin in zip(seen[1:], scripted.spins[1:], strict=True):
        assert spin / 2e9 == pytest.approx(kt._QUEUE_LEFT_CALLS * 50e-6 + n * (host_s - gpu_s), rel=1e-3)
    assert m.details.spin_released_batches == 1


def test_a_rested_attempt_is_never_released(scripted, monkeypatch):
    """Each rested iteration synchronizes: a held wait ahead of it would sit out its whole budget."""
    monkeypatch.setattr(kt, "host_release", lambda: object())
    seen = scripted(lambda b, n: [_call(10_000) for _ in range(n)])
    _timer(max_time_s=0.02, rested_call_s=0).measure(lambda: None, pause_s=0.001)
    assert seen and not any(scripted.released)
