"""The multi-rank timing protocol without processes: an agreed warmup count, rounds until the stopping
rule says stop (the same decision from the same gathered numbers on every rank), and the slowest /
fastest / spread per iteration. A scripted second rank stands in for the group."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

import pytest

from operatorx.measure import TimingSettings
from operatorx.measure.rank_timing import (
    MAX_WARMUP_CALLS,
    HostIterationClock,
    RoundsIncomplete,
    RoundTimes,
    agreed_warmup_calls,
    collective_busy_ns,
    measure_ranks,
    per_iteration,
    round_of_calls,
)
from operatorx.measure.trace import Activity, CallTrace

SETTINGS = TimingSettings(warmup_calls=3, warmup_floor_s=0, first_warmup_floor_s=0, min_samples=5, max_samples=20,
                          max_time_s=0)
LAG_US = 1000.0


class ScriptedPeer:
    """Rank 0's view of a group of two whose rank 1 is always LAG_US slower and reports a slower call
    and a longer floor (so the agreed warmup is the peer's)."""

    rank, world = 0, 2

    def __init__(self) -> None:
        self.maxed: list[list[float]] = []

    def max_floats(self, values: Sequence[float]) -> list[float]:
        peer = [values[0] * 10, 0.0, values[2]]          # its call takes 10x as long
        self.maxed.append([max(a, b) for a, b in zip(values, peer, strict=True)])
        return self.maxed[-1]

    def gather_floats(self, values: Sequence[float]) -> list[list[float]]:
        mine = list(values)
        if len(mine) == 1:                                # the capped flags
            return [mine, [0.0]]
        n = (len(mine) - 2) // 2                          # n times, n starved flags, incomplete, elapsed
        return [mine, [v + LAG_US for v in mine[:n]] + self.peer_flags(n) + [mine[-1]]]

    def peer_flags(self, n: int) -> list[float]:
        """The peer's starved flags and incomplete flag of a round (none here)."""
        return [0.0] * (n + 1)


def test_per_iteration_takes_the_slowest_and_fastest_rank_of_each_iteration():
    it = per_iteration([[10.0, 20.0, 30.0], [12.0, 15.0, 31.0], [11.0, 25.0, 29.0]])
    assert it.max_us == [12.0, 25.0, 31.0] and it.min_us == [10.0, 15.0, 29.0] and it.spread_us == [2.0, 10.0, 2.0]
    with pytest.raises(ValueError):
        per_iteration([[1.0, 2.0], [1.0]])


def test_the_warmup_count_comes_from_the_slowest_rank_and_the_floor():
    assert agreed_warmup_calls(call_s=0.001, floor_s=0.010, elapsed_s=0.002, min_calls=5) == 10
    assert agreed_warmup_calls(call_s=0.001, floor_s=0.0, elapsed_s=0.002, min_calls=5) == 5
    assert agreed_warmup_calls(call_s=1e-9, floor_s=1.0, elapsed_s=0.0, min_calls=5) == MAX_WARMUP_CALLS


def test_a_lagging_rank_sets_the_latency_and_shows_as_skew():
    peer = ScriptedPeer()
    calls: list[int] = []
    barriers: list[int] = []
    clock = HostIterationClock(lambda: barriers.append(1))
    m = measure_ranks(lambda: calls.append(1), clock, peer, SETTINGS)
    mine = m.by_rank_us[0]
    assert m.by_rank_us[1] == pytest.approx([v + LAG_US for v in mine])
    assert m.skew_us == pytest.approx(LAG_US)
    assert m.latency_us == pytest.approx(statistics.median(mine) + LAG_US)
    assert m.latency_us_min == pytest.approx(statistics.median(mine))
    assert m.rank_latency_us(1) == pytest.approx(m.latency_us)
    # max_time_s=0: the first round that holds min_samples ends it; one barrier per timed iteration
    assert m.stop_reason in ("time_cap", "noise_target") and len(mine) == 16 == len(barriers)
    # the agreed warmup used the peer's (slower) call: both ranks make the same number of calls
    assert m.warmup_calls == len(calls) - len(mine) >= SETTINGS.warmup_calls
    assert peer.maxed[0][0] > 0 and m.method == "ranks/host_clock/perf_counter" and m.clock == "host"
    assert m.busy_us is None and m.busy_median_us() is None and m.collective_median_us() is None


class KernelRecordsClock:
    """A clock that reports kernel times as the CUDA kernel-span clock does: call i takes 10+i µs, of
    which 6+i busy and 2 in collectives."""

    clock, method, barrier_name = "device", "scripted/kernel_span", "scripted"

    def __init__(self) -> None:
        self.made = 0

    def synced_call(self, fn) -> None:
        fn()

    def round(self, fn, n, call_s, pause_s, before_barrier, head_start=1.0) -> RoundTimes:
        out = RoundTimes([10.0 + self.made + i for i in range(n)], [6.0 + self.made + i for i in range(n)],
                         [2.0] * n)
        self.made += n
        return out


def test_a_ranks_kernel_times_are_kept_iteration_by_iteration_and_their_medians_reported():
    m = measure_ranks(lambda: None, KernelRecordsClock(), ScriptedPeer(), SETTINGS)
    n = len(m.by_rank_us[0])
    assert m.by_rank_us[0] == [10.0 + i for i in range(n)]
    assert m.busy_us == [6.0 + i for i in range(n)] and m.collective_us == [2.0] * n
    assert m.busy_median_us() == pytest.approx(statistics.median(6.0 + i for i in range(n)))
    assert m.collective_median_us() == 2.0


def test_the_collective_time_of_a_call_is_its_nccl_kernels_busy_time_overlaps_once():
    def act(name: str, start: int, end: int) -> Activity:
        return Activity(name, start, end, 0)

    call = CallTrace([act("sm90_xmma_gemm", 0, 100), act("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 80, 150),
                      act("ncclDevKernel_AllGather_RING_LL", 140, 200), act("elementwise", 210, 220)])
    assert collective_busy_ns(call) == 120          # 80..200, the overlap 140..150 once
    assert call.busy_ns == 210 and call.span_ns == 220
    assert collective_busy_ns(CallTrace([act("sm90_xmma_gemm", 0, 100)])) == 0


class StarvingPeer(ScriptedPeer):
    """A peer whose GPU sat idle in the iterations `starved(round, i)` says, and whose records of
    round `incomplete_round` (if any) missed a call."""

    def __init__(self, starved=lambda r, i: False, incomplete_round: int = -1) -> None:
        super().__init__()
        self.starved, self.incomplete_round, self.rounds = starved, incomplete_round, 0

    def peer_flags(self, n: int) -> list[float]:
        r = self.rounds
        self.rounds += 1
        return [1.0 if self.starved(r, i) else 0.0 for i in range(n)] + [1.0 if r == self.incomplete_round else 0.0]


class SpyClock(KernelRecordsClock):
    """The kernel-records clock, remembering each round's head start; its own round `incomplete_round`
    misses a call."""

    def __init__(self, incomplete_round: int = -1) -> None:
        super().__init__()
        self.head_starts: list[float] = []
        self.incomplete_round = incomplete_round

    def round(self, fn, n, call_s, pause_s, before_barrier, head_start=1.0) -> RoundTimes:
        self.head_starts.append(head_start)
        out = super().round(fn, n, call_s, pause_s, before_barrier, head_start)
        if len(self.head_starts) - 1 == self.incomplete_round:
            return RoundTimes([0.0] * n, incomplete="1 call without kernels")
        return out


def test_an_iteration_a_peer_starved_in_is_dropped_on_every_rank_and_the_next_round_starts_further_ahead():
    # the peer's GPU sat idle in iterations 3 and 7 of the first round: both ranks drop them
    clock = SpyClock()
    two_rounds = dataclasses.replace(SETTINGS, min_samples=20, max_samples=40)
    m = measure_ranks(lambda: None, clock, StarvingPeer(lambda r, i: r == 0 and i in (3, 7)), two_rounds)
    assert m.starved_dropped == 2 and not m.host_gaps_included
    kept_first = [10.0 + i for i in range(16) if i not in (3, 7)]
    assert m.by_rank_us[0][:14] == kept_first
    assert m.by_rank_us[1][:14] == [v + LAG_US for v in kept_first]
    assert m.busy_us is not None and m.busy_us[:14] == [6.0 + i for i in range(16) if i not in (3, 7)]
    assert clock.head_starts[:2] == [1.0, 2.0]        # a round lost iterations: twice the head start


def test_an_op_that_starves_every_iteration_is_kept_after_three_rounds_and_says_so():
    clock = SpyClock()
    m = measure_ranks(lambda: None, clock, StarvingPeer(lambda r, i: True), SETTINGS)
    assert m.host_gaps_included and m.starved_dropped == 32      # two rounds dropped, then kept
    assert m.starved_kept == len(m.by_rank_us[0]) >= 16
    assert m.by_rank_us[0][:16] == [10.0 + 32 + i for i in range(16)]


def test_a_peers_incomplete_records_stop_this_rank_too_with_the_ranks_named():
    with pytest.raises(RoundsIncomplete, match=r"rank\(s\) \[1\] of 2"):
        measure_ranks(lambda: None, SpyClock(), StarvingPeer(incomplete_round=0), SETTINGS)


def test_this_ranks_incomplete_round_is_told_to_the_peers_before_it_raises():
    peer = StarvingPeer()
    with pytest.raises(RoundsIncomplete, match=r"rank\(s\) \[0\] of 2.*1 call without kernels"):
        measure_ranks(lambda: None, SpyClock(incomplete_round=0), peer, SETTINGS)
    assert peer.rounds == 1                            # the exchange happened: the peer is not left waiting


def test_a_round_of_call_traces_gives_spans_busy_starved_or_why_it_is_incomplete():
    def act(name: str, start: int, end: int) -> Activity:
        return Activity(name, start, end, 0)

    ok = CallTrace([act("gemm", 0, 1000), act("ncclDevKernel_AllReduce", 1000, 3000)])
    starved = CallTrace([act("gemm", 10_000, 11_000)], max_gap_ns=8_000)
    r = round_of_calls([ok, starved], 2)
    assert r.call_us == [3.0, 1.0] and r.busy_us == [3.0, 1.0] and r.collective_us == [2.0, 0.0]
    assert r.starved == [False, True] and r.incomplete is None
    short = round_of_calls([ok, CallTrace([])], 2)
    assert short.incomplete is not None and "1 without kernels" in short.incomplete and short.call_us == [0.0, 0.0]
    assert "2 calls recorded" in (round_of_calls([ok, ok], 3).incomplete or "")
    assert "4 records dropped" in (round_of_calls([ok], 1, records_dropped=4).incomplete or "")
