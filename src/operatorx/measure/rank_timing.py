"""Timing one call over W ranks that run it together: every rank runs the same iterations, each behind
a barrier, and the case's number is the slowest rank's.

The protocol (upstream OperatorX's for multi-rank ops, kept here):
- warmup: every rank runs the same number of calls. The count is agreed before the first is made
  (a collective op paired with a different call on another rank would hang or mix up data): each
  rank times two synchronized calls, the ranks take the largest call time and wall-clock floor,
  and every rank derives the same count from them;
- each timed iteration: a barrier, then the timed call. On CUDA the barrier is an all_reduce of one
  element on the device, with no host synchronization: the host enqueues the whole round ahead of
  the GPU (behind a spin), the ranks' GPUs leave the barrier together, and how late each host
  launched is not measured. Each iteration's time there is its call's kernel span from the
  process's activity records (first kernel start to last kernel end, as single-rank rows read it),
  with the rank's busy time and its collectives' (NCCL kernels') busy time beside it; `--timing
  events` reads a CUDA event pair instead. On the CPU it is a gloo all_reduce of one element, then
  the host clock;
- after each round the ranks exchange their times (and rank 0's elapsed wall time), so every rank
  holds the same W × n matrix and takes the same decision to stop (measure/loop.py's rule, applied
  to the per-iteration maxima) with no further message. With the times go two flags: an iteration
  that some rank's GPU sat idle in (a starved call: that host had not kept up, measure/trace.py) is
  dropped on every rank, because a late rank also holds its peers in their collectives; and a rank
  whose activity records missed a call makes every rank stop with the same error, where one rank
  raising alone would leave the others waiting in the next exchange;
- per iteration the max and min over ranks: `latency_us` = median of the maxima (the slowest rank,
  what the layer costs), `latency_us_min` = median of the minima, `skew_us` = median of max − min.
A capped rank (its GPU under a power or thermal cap) makes every rank take the attempt again
(`measure_ranks_with_retries`), because a rank left alone in a retry would wait in its collectives.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from operatorx.measure.loop import mark_process_warmed, stop_reason
from operatorx.measure.settings import TimingSettings
from operatorx.measure.stats import summarize
from operatorx.measure.telemetry import Telemetry, TelemetrySampler
from operatorx.measure.trace import CallTrace

__all__ = ["Agree", "IterationClock", "HostIterationClock", "CudaIterationClock", "KernelIterationClock",
           "RoundTimes", "RoundsIncomplete", "collective_busy_ns", "round_of_calls", "RankMeasurement",
           "RankAttempts", "agreed_warmup_calls", "measure_ranks", "measure_ranks_with_retries", "per_iteration",
           "MAX_WARMUP_CALLS"]

MAX_WARMUP_CALLS = 10_000
"""The agreed warmup never makes more calls than this (a µs call under a 1 s first floor)."""

_ROUND_CALLS = 16
"""Timed iterations per round, between two exchanges of the ranks' times."""


class Agree(Protocol):
    """The ranks' control channel (a CPU process group): plain numbers, never the op's data."""

    rank: int
    world: int

    def max_floats(self, values: Sequence[float]) -> list[float]:
        """Each value's maximum over the ranks (every rank gets the same list)."""
        ...

    def gather_floats(self, values: Sequence[float]) -> list[list[float]]:
        """Every rank's `values` (the same length on each), in rank order, on every rank."""
        ...


@dataclass(frozen=True)
class RoundTimes:
    """One rank's times of a round's iterations (µs): the call's time, and where kernels were recorded,
    the time some kernel of the call ran (busy) and the time its collectives' kernels ran."""

    call_us: list[float]
    busy_us: Optional[list[float]] = None
    collective_us: Optional[list[float]] = None
    starved: Optional[list[bool]] = None
    """Per iteration: the GPU sat idle before or inside the call (kernel records only)."""
    incomplete: Optional[str] = None
    """Why this round's records cannot be used (a call without kernels, dropped records); its times are
    then placeholders, and every rank stops when it learns of it."""


class IterationClock(Protocol):
    """How one rank runs a synchronized call and a round of barrier-then-timed-call iterations."""

    barrier_name: str
    clock: str
    """`host` or `device`: which clock the samples come from."""
    method: str

    def synced_call(self, fn: Callable[[], Any]) -> None:
        """Call `fn` and wait until its work is done."""
        ...

    def round(self, fn: Callable[[], Any], n: int, call_s: float, pause_s: float,
              before_barrier: Optional[Callable[[], None]], head_start: float = 1.0) -> RoundTimes:
        """`n` iterations of barrier + timed call; each iteration's times. `head_start` scales the
        GPU spin the round is enqueued behind (it grows after a round with starved calls)."""
        ...


class HostIterationClock:
    """CPU ranks: a blocking barrier (gloo all_reduce of one element), then `perf_counter` around the call."""

    clock = "host"
    method = "ranks/host_clock/perf_counter"

    def __init__(self, barrier: Callable[[], None], barrier_name: str = "gloo all_reduce of one element"):
        self._barrier = barrier
        self.barrier_name = barrier_name

    def synced_call(self, fn: Callable[[], Any]) -> None:
        fn()

    def round(self, fn: Callable[[], Any], n: int, call_s: float, pause_s: float,
              before_barrier: Optional[Callable[[], None]], head_start: float = 1.0) -> RoundTimes:
        out: list[float] = []
        for _ in range(n):
            if before_barrier is not None:
                before_barrier()
            self._barrier()
            t0 = time.perf_counter_ns()
            fn()
            out.append((time.perf_counter_ns() - t0) / 1e3)
            if pause_s > 0:
                time.sleep(pause_s)
        return RoundTimes(out)


_MAX_SPIN_S = 0.05


def _spin_cycles(n: int, call_s: float, hz: float, head_start: float = 1.0) -> int:
    """The GPU spin the host enqueues a round of `n` calls behind: ~30 µs a call of launches, the call
    itself, times `head_start`, at most 50 ms."""
    return int(min(_MAX_SPIN_S, head_start * n * (call_s + 30e-6)) * hz)


class CudaIterationClock:
    """CUDA ranks under `--timing events`: the round is enqueued behind a GPU spin; each iteration
    flushes L2 (the run's state), waits in a device all_reduce of one element (no host sync), and is
    timed by a CUDA event pair."""

    clock = "device"
    method = "ranks/cuda_events"
    barrier_name = "device all_reduce of one element, no host sync"

    def __init__(self, barrier: Callable[[], None], flush: Callable[[], None], sm_clock_hz: Optional[float]):
        self._barrier, self._flush = barrier, flush
        self._hz = sm_clock_hz or 2.0e9          # a spin sized at 2 GHz where NVML gave no clock

    def synced_call(self, fn: Callable[[], Any]) -> None:
        import torch

        fn()
        torch.cuda.synchronize()

    def round(self, fn: Callable[[], Any], n: int, call_s: float, pause_s: float,
              before_barrier: Optional[Callable[[], None]], head_start: float = 1.0) -> RoundTimes:
        import torch

        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        torch.cuda._sleep(_spin_cycles(n, call_s, self._hz, head_start))
        for i in range(n):
            if before_barrier is not None:
                before_barrier()
            self._flush()
            self._barrier()
            starts[i].record()
            fn()
            ends[i].record()
            if pause_s > 0:
                torch.cuda._sleep(int(pause_s * self._hz))
        torch.cuda.synchronize()
        return RoundTimes([s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends, strict=True)])


def collective_busy_ns(call: CallTrace) -> int:
    """Time some collective (NCCL) kernel of the call ran, overlaps counted once."""
    return CallTrace([a for a in call.activities if "nccl" in a.name.lower()]).busy_ns


class KernelIterationClock:
    """CUDA ranks (the default `kernels` timing): the same round as `CudaIterationClock` (behind a GPU
    spin; per iteration the L2 flush and the device barrier, outside the call), recorded by the
    process's activity session. An iteration's time is its call's kernel span, as a single-rank row's,
    so one rank reads what the plain path reads; its busy and collective times come with it, and
    whether the call was starved. A round whose records miss a call is `incomplete`: a span that lost
    a kernel must not pass as a shorter time."""

    clock = "device"
    method = "ranks/kernel_span"
    barrier_name = "device all_reduce of one element, no host sync"

    def __init__(self, barrier: Callable[[], None], flush: Callable[[], None], sm_clock_hz: Optional[float]):
        self._barrier, self._flush = barrier, flush
        self._hz = sm_clock_hz or 2.0e9

    def synced_call(self, fn: Callable[[], Any]) -> None:
        import torch

        fn()
        torch.cuda.synchronize()

    def round(self, fn: Callable[[], Any], n: int, call_s: float, pause_s: float,
              before_barrier: Optional[Callable[[], None]], head_start: float = 1.0) -> RoundTimes:
        from operatorx.measure.activity import activity_session
        from operatorx.measure.trace import trace_batch

        activity_session().discard()    # the warmup's and the exchanges' records are no round's

        def outside_the_call() -> None:
            if before_barrier is not None:
                before_barrier()
            self._flush()
            self._barrier()

        batch = trace_batch(fn, n, outside_the_call, _spin_cycles(n, call_s, self._hz, head_start),
                            pause_s=pause_s, pause_spin_cycles=int(pause_s * self._hz) if pause_s > 0 else 0)
        return round_of_calls(batch.calls, n, batch.records_dropped)


def round_of_calls(calls: Sequence[CallTrace], n: int, records_dropped: int = 0) -> RoundTimes:
    """A round's times from its `n` calls' traces (spans, busy, collectives, starved), or an incomplete
    round (placeholder zeros and why) when the records miss a call or lost some."""
    if len(calls) != n or any(not c.activities for c in calls) or records_dropped:
        why = (f"kernel records incomplete for a round of {n} calls: {len(calls)} calls recorded, "
               f"{sum(1 for c in calls if not c.activities)} without kernels, {records_dropped} records dropped")
        return RoundTimes([0.0] * n, [0.0] * n, [0.0] * n, [False] * n, incomplete=why)
    return RoundTimes([c.span_ns / 1e3 for c in calls], [c.busy_ns / 1e3 for c in calls],
                      [collective_busy_ns(c) / 1e3 for c in calls], [c.starved for c in calls])


@dataclass(frozen=True)
class PerIteration:
    """Per timed iteration, over the ranks: the slowest, the fastest, and their difference (µs)."""

    max_us: list[float]
    min_us: list[float]
    spread_us: list[float]


def per_iteration(by_rank: Sequence[Sequence[float]]) -> PerIteration:
    """The max, min and spread of each iteration (column) of a W × n matrix of µs."""
    if not by_rank or any(len(r) != len(by_rank[0]) for r in by_rank):
        raise ValueError("every rank needs the same number of iterations")
    columns = list(zip(*by_rank, strict=True))
    hi = [max(c) for c in columns]
    lo = [min(c) for c in columns]
    return PerIteration(hi, lo, [h - low for h, low in zip(hi, lo, strict=True)])


@dataclass(frozen=True)
class RankMeasurement:
    """One attempt over all ranks; every rank holds the same one."""

    by_rank_us: list[list[float]]
    """Each rank's time of each timed iteration, in rank order."""
    iterations: PerIteration
    warmup_calls: int
    warmup_s: float
    stop_reason: str
    method: str
    clock: str
    barrier: str
    window_start_s: float
    """This rank's perf_counter when the timed iterations began (its telemetry window starts there)."""
    pause_s: float = 0.0
    busy_us: Optional[list[float]] = None
    """This rank's busy time of every timed iteration (kernel records only; else None)."""
    collective_us: Optional[list[float]] = None
    """This rank's collectives' kernel time of every timed iteration (kernel records only; else None)."""
    starved_dropped: int = 0
    """Iterations dropped on every rank because some rank's GPU sat idle in its call (host late)."""
    starved_kept: int = 0
    """Starved iterations kept once every iteration of three rounds in a row was starved."""
    host_gaps_included: bool = False
    """The op itself leaves the GPU idle inside its call: its starved iterations are kept."""

    @property
    def latency_us(self) -> float:
        """Median of the per-iteration maxima: the slowest rank, what the layer takes."""
        return float(statistics.median(self.iterations.max_us))

    @property
    def latency_us_min(self) -> float:
        return float(statistics.median(self.iterations.min_us))

    @property
    def skew_us(self) -> float:
        return float(statistics.median(self.iterations.spread_us))

    def rank_latency_us(self, rank: int) -> float:
        return float(statistics.median(self.by_rank_us[rank]))

    def busy_median_us(self) -> Optional[float]:
        """This rank's median busy time (None without kernel records)."""
        return float(statistics.median(self.busy_us)) if self.busy_us else None

    def collective_median_us(self) -> Optional[float]:
        return float(statistics.median(self.collective_us)) if self.collective_us else None

    def summary(self) -> dict[str, float]:
        """Statistics of the per-iteration maxima (the row's `samples_us`)."""
        return summarize(self.iterations.max_us)


def agreed_warmup_calls(call_s: float, floor_s: float, elapsed_s: float, min_calls: int) -> int:
    """The warmup's call count from the ranks' largest call time and floor: every rank gets the same
    one. At least `min_calls`, enough calls to fill what is left of the floor, at most MAX_WARMUP_CALLS."""
    left_s = max(0.0, floor_s - elapsed_s)
    more = math.ceil(left_s / call_s) if call_s > 0 else 0
    return int(min(MAX_WARMUP_CALLS, max(min_calls, 2 + more)))


def _warmup(fn: Callable[[], Any], clock: IterationClock, agree: Agree, settings: TimingSettings,
            first_op: bool) -> tuple[int, float, float]:
    """(calls, seconds, the slowest rank's call seconds), the count agreed across ranks."""
    start = time.perf_counter()
    clock.synced_call(fn)                       # the first call pays lazy set-up
    t = time.perf_counter()
    clock.synced_call(fn)
    call_s = time.perf_counter() - t
    floor_s = settings.first_warmup_floor_s if first_op else settings.warmup_floor_s
    call_s, floor_s, elapsed_s = agree.max_floats([call_s, floor_s, time.perf_counter() - start])
    calls = agreed_warmup_calls(call_s, floor_s, elapsed_s, settings.warmup_calls)
    for _ in range(calls - 2):
        clock.synced_call(fn)
    mark_process_warmed()
    return calls, time.perf_counter() - start, call_s


_ALL_STARVED_ROUNDS = 3
"""Rounds in a row with every iteration starved on some rank: the op itself leaves the GPU idle
(it waits on the host inside the call); its spans are then kept and the row says so."""

_MAX_HEAD_START = 64.0


class RoundsIncomplete(RuntimeError):
    """Some rank's activity records missed a call of a round; raised on every rank alike."""


@dataclass
class _Kept:
    """The iterations kept so far: every rank's times, this rank's busy and collective times."""

    by_rank: list[list[float]]
    busy: Optional[list[float]] = field(default_factory=list)
    collective: Optional[list[float]] = field(default_factory=list)
    starved_dropped: int = 0
    starved_kept: int = 0
    gaps_included: bool = False
    all_starved_streak: int = 0

    def add(self, rows: Sequence[Sequence[float]], mine: RoundTimes, n: int) -> bool:
        """Keep the round's iterations that no rank starved in (all of them once gaps are included);
        True when some were dropped (the next round gets a longer head start)."""
        starved_any = [any(row[n + i] > 0 for row in rows) for i in range(n)]
        if all(starved_any) and not self.gaps_included:
            self.all_starved_streak += 1
            if self.all_starved_streak >= _ALL_STARVED_ROUNDS:
                self.gaps_included = True
        else:
            self.all_starved_streak = 0
        if self.gaps_included:
            keep = list(range(n))
            self.starved_kept += sum(starved_any)
        else:
            keep = [i for i in range(n) if not starved_any[i]]
            self.starved_dropped += n - len(keep)
        for r, row in enumerate(rows):
            self.by_rank[r].extend(row[i] for i in keep)
        self.busy = self.busy + [mine.busy_us[i] for i in keep] \
            if self.busy is not None and mine.busy_us is not None else None
        self.collective = self.collective + [mine.collective_us[i] for i in keep] \
            if self.collective is not None and mine.collective_us is not None else None
        return len(keep) < n


def _flags(mine: RoundTimes, n: int) -> list[float]:
    starved = mine.starved or [False] * n
    return [1.0 if s else 0.0 for s in starved]


def _raise_if_incomplete(rows: Sequence[Sequence[float]], n: int, mine: RoundTimes) -> None:
    """Every rank raises the same error when some rank's round was incomplete."""
    ranks = [r for r, row in enumerate(rows) if row[2 * n] > 0]
    if ranks:
        mine_said = f"; this rank: {mine.incomplete}" if mine.incomplete else ""
        raise RoundsIncomplete(f"kernel records incomplete on rank(s) {ranks} of {len(rows)}: a span that lost "
                               f"a kernel would read short, so no rank's times are used{mine_said}")


def measure_ranks(fn: Callable[[], Any], clock: IterationClock, agree: Agree, settings: TimingSettings, *,
                  first_op: bool = False, pause_s: float = 0.0,
                  before_barrier: Optional[Callable[[], None]] = None) -> RankMeasurement:
    """One attempt: the agreed warmup, then rounds of barrier + timed call until the stopping rule,
    applied by every rank to the same per-iteration maxima, says stop. A collective call: every rank
    of the group calls it with the same settings."""
    calls, warm_s, call_s = _warmup(fn, clock, agree, settings, first_op)
    kept = _Kept([[] for _ in range(agree.world)])
    start = time.perf_counter()
    reason: Optional[str] = None
    head_start = 1.0
    rounds = 0
    while reason is None:
        n = max(1, min(_ROUND_CALLS, settings.max_samples - len(kept.by_rank[0])))
        mine = clock.round(fn, n, call_s, pause_s, before_barrier, head_start)
        rows = agree.gather_floats([*mine.call_us, *_flags(mine, n), 1.0 if mine.incomplete else 0.0,
                                    time.perf_counter() - start])
        _raise_if_incomplete(rows, n, mine)
        rounds += 1
        if kept.add(rows, mine, n):
            head_start = min(_MAX_HEAD_START, head_start * 2)   # the same on every rank: the flags are shared
        elapsed0 = rows[0][-1]                 # rank 0's clock decides, the same on every rank
        if kept.by_rank[0]:
            reason = stop_reason(per_iteration(kept.by_rank).max_us, elapsed0, settings)
        elif elapsed0 >= settings.timeout_s:
            raise RoundsIncomplete(f"every iteration of {rounds} rounds was starved on some rank for "
                                   f"{elapsed0:.0f} s: no iteration is left to time")
    return RankMeasurement(by_rank_us=kept.by_rank, iterations=per_iteration(kept.by_rank), warmup_calls=calls,
                           warmup_s=warm_s, stop_reason=reason, method=clock.method, clock=clock.clock,
                           barrier=clock.barrier_name, window_start_s=start, pause_s=pause_s,
                           busy_us=kept.busy or None, collective_us=kept.collective or None,
                           starved_dropped=kept.starved_dropped, starved_kept=kept.starved_kept,
                           host_gaps_included=kept.gaps_included)


@dataclass
class RankAttempts:
    """The kept attempt, this rank's telemetry of it, the ranks it found capped, and every attempt in brief."""

    measurement: RankMeasurement
    telemetry: dict[str, Any]
    capped_ranks: list[int]
    attempts: list[dict[str, Any]] = field(default_factory=list)


def measure_ranks_with_retries(fn: Callable[[], Any], clock: IterationClock, agree: Agree, telemetry: Telemetry,
                               settings: TimingSettings, *, first_op: bool = False,
                               before_barrier: Optional[Callable[[], None]] = None) -> RankAttempts:
    """Attempts until none of the ranks was capped (or the retries are spent); every rank takes every
    attempt. Retry k rests `cooldown_s(k)` and pauses between calls as settings.pause_s says. The kept
    attempt is the first that no rank found capped, else the fastest."""
    tried: list[tuple[RankMeasurement, dict[str, Any], list[int]]] = []
    for attempt in range(1 + settings.throttle_retries):
        if attempt:
            time.sleep(settings.cooldown_s(attempt))
        pause_s = settings.pause_s(attempt, tried[0][0].latency_us * 1e-6) if tried else 0.0
        with TelemetrySampler(telemetry, settings.telemetry_period_s, settings.capped_clock_fraction) as sampler:
            m = measure_ranks(fn, clock, agree, settings, first_op=first_op and not tried, pause_s=pause_s,
                              before_barrier=before_barrier)
        seen = sampler.summary(since_s=m.window_start_s)
        flags = agree.gather_floats([1.0 if seen.get("capped") else 0.0])
        capped = [r for r, f in enumerate(flags) if f[0] > 0]
        tried.append((m, seen, capped))
        if not capped:
            break
    uncapped = [i for i, t in enumerate(tried) if not t[2]]
    kept = uncapped[0] if uncapped else min(range(len(tried)), key=lambda i: tried[i][0].latency_us)
    brief = [{"latency_us": m.latency_us, "pause_s": m.pause_s, "capped": bool(c), "capped_ranks": c,
              "stop_reason": m.stop_reason, "samples": len(m.iterations.max_us), "kept": i == kept}
             for i, (m, _, c) in enumerate(tried)]
    m, seen, capped = tried[kept]
    return RankAttempts(m, seen, capped, brief)
