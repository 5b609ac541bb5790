"""Device time from CUPTI's kernel records: the default timer on CUDA (`--timing kernels|graph`).

Each timed call is preceded by the L2 flush of the declared state; a GPU spin ahead of each
batch keeps the host ahead of the GPU, so no call waits on its own launch. One call's device
time is the span from its first kernel's start to its last kernel's end — every kernel it
launched counts (split-K reduce, quantize, its own fills), the harness's flush and spin do
not (measure/trace.py says how they are told apart). No event pair sits around the call, so
nothing of the harness is timed with a µs kernel.

Graph mode captures the op in a CUDA graph and times each replay the same way: what a server
that replays graphs sees (no launch gaps between the op's kernels). The flush stays outside
the graph, so the L2 state is the same as in kernels mode.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Optional

from operatorx.measure.host_release import host_release
from operatorx.measure.host_release import unavailable_reason as release_unavailable
from operatorx.measure.l2 import L2Flusher
from operatorx.measure.loop import GiveUp, capped_stop, stop_reason, warmup
from operatorx.measure.measurement import Measurement, NotMeasurable
from operatorx.measure.record import KernelPhases, KernelsRecord
from operatorx.measure.settings import TimingSettings
from operatorx.measure.side_stream import side_stream
from operatorx.measure.stats import summarize
from operatorx.measure.trace import STARVED_GAP_NS, CallTrace, trace_batch

__all__ = ["KernelTiming", "capture_graph", "warm_activity_session"]

_SPIN_MARGIN = 1.2          # spin this many times the host's enqueue time of a batch (starved calls are
                            # detected and dropped, so the margin only needs to cover the usual case)
_PAUSE_SPIN_S = 200e-6      # extra head start per call in pause mode (throttle retries)
_MAX_BATCH = 512
_MAX_BATCH_S = 0.25         # a batch's calls take about this long at most: the stop rules (time cap, a
                            # capped GPU) are asked between batches, so a longer batch runs on through a
                            # capped attempt
_MIN_ENQUEUE_S = 5e-6
_FIRST_BATCH_S = 0.05       # the first batch's calls take about this long at most (but >= min_samples)
_ALL_STARVED_BATCHES = 3    # this many batches with every call starved: the op waits on the host itself
_EMPTY_BATCHES = 3          # this many batches in a row with no device work recorded: nothing to time
_MAX_SPIN_S = 0.25
_QUEUE_LEFT_CALLS = 8       # the spin is trimmed so that about this many calls' enqueue time is still queued
_MIN_QUEUE_LEFT_S = 100e-6  # on the GPU when the host has enqueued the batch's last call (never less than this)
_FIRST_ENQUEUE_GUESS_S = 300e-6   # per iteration in pause mode before a batch has measured it (starved calls of
                                  # a short first spin are dropped, and the next spin grows)
LAUNCH_QUEUE_DEPTH = 1024  # device launches the host can queue ahead of the GPU before a launch call blocks:
                            # behind a 200 ms spin the H200 (driver 580) took 1,021 one-kernel launches, then
                            # blocked (bench/launch_queue.py)
_QUEUE_FILL = 0.8           # a batch holds at most this share of the queue (launches per call vary a little)


def capture_graph(fn: Callable[[], Any]) -> Callable[[], Any]:
    """`fn` captured in a CUDA graph; its replay. An op that cannot be captured is NotMeasurable."""
    import torch

    stream = side_stream()                 # one per process: see measure/side_stream.py
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.stream(stream):
            fn()
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001 - what capture refuses is the row's reason
        _recover_from_failed_capture()
        raise NotMeasurable(f"cannot be captured in a CUDA graph: {type(err).__name__}: "
                            f"{str(err).strip().splitlines()[0][:300] if str(err).strip() else ''}") from err
    return graph.replay


def _recover_from_failed_capture() -> None:
    """A capture that fails midway leaves torch's CUDA generators marked as capturing, and every
    later `torch.randn(device="cuda")` then raises "Offset increment outside graph capture". An
    empty capture that ends normally runs the generators' capture epilogue and clears that."""
    import torch

    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - the failed capture's own error is the one reported
        pass
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # "The CUDA Graph is empty": that is the point
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                pass
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001
        pass


_profiler_ready = False


def warm_activity_session() -> None:
    """The process's first batch starts CUPTI (about a second): do it outside any case's timed
    window, so the per-case time cap is not spent on it."""
    global _profiler_ready
    if not _profiler_ready:
        import torch

        trace_batch(lambda: torch.cuda._sleep(1000), 2, None, 0)
        _profiler_ready = True


def _enqueue_from_warmup(host_s: list[float]) -> float:
    """Host seconds to enqueue one [flush, call] iteration, from the warmup's own iterations (each
    synchronized after its enqueue, with the session's tracing on, as in a batch; the first is left
    out: it pays lazy set-up), plus half again for the range marks. The first batch's spin is
    sized from it; a fixed guess of 300 µs a call (right for Kineto's CPU tracing) spun the GPU
    ~11 ms before every case's first batch, and 3 extra iterations to time cost ~5 ms a case."""
    import numpy as np

    if len(host_s) < 2:         # one call (a retry's warmup) holds its lazy set-up too: no estimate
        return _FIRST_ENQUEUE_GUESS_S
    return max(_MIN_ENQUEUE_S, 1.5 * float(np.median(host_s[1:])))


def _enqueue_estimate(call: Callable[[], Any], flush: Optional[Callable[[], None]]) -> float:
    """Host seconds to enqueue one [flush, call] iteration of a graph replay, from 3 unsynchronized
    ones after capture, plus half again for the range marks (the warmup ran the op, not its graph)."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        if flush is not None:
            flush()
        call()
    per_call = (time.perf_counter() - t0) / 3
    torch.cuda.synchronize()
    return max(_MIN_ENQUEUE_S, 1.5 * per_call)


def _first_batch(s: TimingSettings, call_s: float) -> int:
    """Calls in the first batch: `batch_size`, or fewer for a long call, so a 20 ms prefill GEMM
    does not spend 0.6 s on samples it may not need: enough for `min_samples` where they fit in
    `timeout_s`, never fewer than one. `call_s` is the warmup's synchronized seconds per call (an
    upper bound on the device time)."""
    if call_s <= 0:
        return s.batch_size
    wanted = min(s.batch_size, max(s.min_samples, int(_FIRST_BATCH_S / call_s)))
    return max(1, min(wanted, int(s.timeout_s / call_s)))


def _next_batch(samples_us: list[float], s: TimingSettings, n: int, call_s: float, left_s: float) -> int:
    """Calls in the next batch: as many as the noise so far says the target needs (noise falls like
    1/sqrt(n)), `batch_size` at least and 512 at most, but never more than fit in the time left
    before the cap, nor in `_MAX_BATCH_S` (`call_s`: the last batch's wall seconds per call; one
    call at least) — a batch is never cut short, so an oversized one would overrun the cap by its
    whole length."""
    from operatorx.measure.stats import median_noise

    fits = max(1, int(min(left_s, _MAX_BATCH_S) / call_s)) if call_s > 0 else _MAX_BATCH
    if len(samples_us) < 2 or s.noise_target <= 0:
        return min(s.batch_size, fits)
    noise = median_noise(samples_us)
    if not noise < float("inf"):
        return min(s.batch_size, fits)
    needed = len(samples_us) * (noise / s.noise_target) ** 2 - len(samples_us)
    return int(min(_MAX_BATCH, fits, max(s.batch_size, 1.2 * needed)))


def _next_spin_s(lead_s_per_call: float, n: int, enqueue_s: float) -> float:
    """The spin ahead of a batch of `n` calls, once a batch has measured how far the host falls behind
    the GPU per call (`lead_s_per_call`, negative when the GPU is the slower one): enough that the
    last call still has `_QUEUE_LEFT_CALLS` calls' worth of work queued before it, and never less
    than that (the first calls need a head start however fast the GPU drains). A fixed 1.2 x the
    host's whole enqueue time also waited for the GPU's own work: a 5 µs GEMM behind its 25 µs L2
    flush spun the GPU ~70% longer than the host needed."""
    keep_s = max(_MIN_QUEUE_LEFT_S, _QUEUE_LEFT_CALLS * enqueue_s)
    return max(keep_s, keep_s + n * lead_s_per_call)


def launches_per_iteration(calls: list[CallTrace], harness_activities: int, n: int) -> float:
    """Device activities one [flush, call] iteration put in the launch queue, from a batch: the calls'
    own kernels, copies and sets, and the harness's flush (the batch's one spin counted in with
    them: an overestimate of at most one launch per batch, on the safe side)."""
    return (sum(len(c.activities) for c in calls) + harness_activities) / max(1, n)


def queue_calls(per_iteration: float) -> int:
    """The most iterations one batch may hold: all of them are queued behind the spin before the GPU
    starts on the first, and the launch queue takes about `LAUNCH_QUEUE_DEPTH` launches. Past that the
    host blocks inside a launch until the GPU frees room: its enqueue time then measures the spin,
    the next spin grows with it, and the calls enqueued after the spin ended run paced by the host
    (starved), and the spins grow for nothing."""
    return max(1, int(_QUEUE_FILL * LAUNCH_QUEUE_DEPTH / max(1.0, per_iteration)))


def _host_lead_s(spin_s: float, n: int, queue_left_s: float) -> float:
    """Per call, how much longer the host took to enqueue than the GPU took to run, from one batch:
    the GPU had `spin_s + n * gpu` of work, the host took `n * host`, and `queue_left_s` of it was
    still queued when the host finished, so `n * (host - gpu) = spin_s - queue_left_s`."""
    return (spin_s - queue_left_s) / n


class KernelTiming:
    def __init__(self, settings: TimingSettings, flusher: L2Flusher, sm_clock_hz: float, graph: bool = False):
        self.settings = settings
        self.flusher = flusher
        self.sm_clock_hz = sm_clock_hz
        self.graph = graph
        self.method = "cupti_kernels/cuda_graph" if graph else "cupti_kernels"

    def _cycles(self, seconds: float) -> int:
        return int(min(seconds, _MAX_SPIN_S) * self.sm_clock_hz)

    def measure(self, fn: Callable[[], Any], pause_s: float = 0.0,
                give_up: Optional[GiveUp] = None) -> Measurement[KernelsRecord]:
        import torch

        s = self.settings
        warm_activity_session()
        flush = self.flusher.flush if self.flusher.state != "warm" else None
        host_s: list[float] = []

        def warm_call() -> None:
            t0 = time.perf_counter()
            if flush is not None:
                flush()
            fn()
            host_s.append(time.perf_counter() - t0)

        calls, warm_s, call_s = warmup(warm_call, torch.cuda.synchronize, s, rest_s=pause_s, rest_long_calls=True)
        pause_s = pause_s or s.rested_pause_s(call_s)       # a long call is timed rested from the first attempt
        call = capture_graph(fn) if self.graph else fn
        if self.graph:
            call()
            torch.cuda.synchronize()
        samples_us: list[float] = []
        busy_us: list[float] = []
        gaps_ns: list[int] = []
        starved = unattributed = batches = spin_short = 0
        enqueue_s = _FIRST_ENQUEUE_GUESS_S
        if s.spin and not self.graph:       # a rested attempt's head start per call is sized from it too
            enqueue_s = _enqueue_from_warmup(host_s)
        elif s.spin and pause_s == 0:
            enqueue_s = _enqueue_estimate(call, flush)
        from operatorx.measure.activity import CuptiSession, activity_session, fallback_reason

        session = activity_session()
        if s.spin:
            host_release()                  # built (Triton's compile) before the timed window, if not yet
        session.discard()                   # the warmup's records are not the first batch's
        spin_gpu_s = batches_s = 0.0
        records_dropped = forced_flushes = 0
        wall0 = time.perf_counter()
        reason = None
        batch = None
        n = _first_batch(s, call_s)
        lead_s: Optional[float] = None      # host behind GPU per call, once a batch has measured it
        all_starved_streak = 0
        empty_batches = 0
        starved_kept = late_kept = overflowed_batches = 0
        gaps_included = False
        released_batches = 0
        max_calls: Optional[int] = None     # what the launch queue holds (known after the first batch)
        while reason is None:
            n = max(1, min(n, s.max_samples - len(samples_us), max_calls or n))
            spin_s = 0.0
            if s.spin and pause_s == 0:
                spin_s = _SPIN_MARGIN * enqueue_s * n if lead_s is None else _next_spin_s(lead_s, n, enqueue_s)
            spin = self._cycles(spin_s)
            # an untrimmed spin (the first batch, a multi-kernel call) waits for the host's last launch
            # instead, `spin` being its longest; a trimmed one lets the GPU start before the host is done
            release = spin > 0 and pause_s == 0 and lead_s is None and host_release() is not None
            pause_spin = self._cycles(2 * enqueue_s + _PAUSE_SPIN_S) if s.spin else 0
            t_batch = time.perf_counter()
            batch = trace_batch(call, n, flush, spin, pause_s=pause_s, pause_spin_cycles=pause_spin,
                                released=release)
            batches_s += time.perf_counter() - t_batch
            batch_call_s = (time.perf_counter() - t_batch) / n
            held_s = spin / self.sm_clock_hz
            if release:                     # the wait ended when the host had enqueued the batch
                held_s = min(held_s, n * batch.enqueue_s_per_call)
                released_batches += 1
            spin_gpu_s += held_s + (n * pause_spin / self.sm_clock_hz if pause_s > 0 else 0)
            batches += 1
            unattributed += batch.unattributed
            records_dropped += batch.records_dropped
            forced_flushes += batch.forced_flush
            with_work = [c for c in batch.calls if c.activities]
            kept = with_work if gaps_included else [c for c in with_work if not c.starved]
            all_starved_streak = all_starved_streak + 1 if with_work and not kept else 0
            if all_starved_streak >= _ALL_STARVED_BATCHES and not gaps_included:
                gaps_included, kept = True, with_work     # the op itself leaves the GPU idle: keep and say so
            n_starved = sum(c.starved for c in with_work)
            if gaps_included:
                starved_kept += n_starved
            else:
                starved += n_starved
            overflowed = False
            if pause_s == 0:                # (a rested iteration synchronizes: its queue never fills)
                max_calls = queue_calls(launches_per_iteration(batch.calls, batch.harness_activities, n))
                overflowed = n > max_calls
                overflowed_batches += overflowed
            if pause_s == 0 and not overflowed:     # a blocked host's enqueue time is the GPU's pace, not its own
                enqueue_s = max(enqueue_s, batch.enqueue_s_per_call) if batches > 1 else batch.enqueue_s_per_call
            if overflowed:
                pass                        # starved calls past the queue's depth: the next batch is smaller instead
            elif len(kept) < len(with_work):
                spin_short += 1
                enqueue_s *= 2              # the queue ran dry: give the next batch twice the head start
                lead_s = None               # (sized from the enqueue time again, not trimmed)
            elif spin > 0 and batch.queue_left_ns is not None and all(len(c.activities) == 1 for c in kept):
                # only a single-kernel call's spin is trimmed: the GPU running a multi-kernel call while
                # the host still launches it grows the gaps between its kernels (its span, not its busy
                # time): such spans read longer in a second pass with a trimmed spin
                lead_s = _host_lead_s(held_s, n, batch.queue_left_ns / 1e9)
            late_kept += sum(c.launched_late > 0 for c in kept)
            samples_us.extend(c.span_ns / 1e3 for c in kept)
            busy_us.extend(c.busy_ns / 1e3 for c in kept)
            gaps_ns.extend(c.gap_before_ns for c in kept if c.gap_before_ns is not None)
            empty_batches = 0 if with_work else empty_batches + 1
            if empty_batches >= _EMPTY_BATCHES:
                raise NotMeasurable(f"the op launched no device work that CUPTI recorded in {_EMPTY_BATCHES} "
                                    "batches in a row (a host-only op?)")
            wall_s = time.perf_counter() - wall0
            reason = stop_reason(samples_us, wall_s, s) or capped_stop(give_up, wall0, len(samples_us))
            cap_s = min(s.max_time_s, s.timeout_s) if len(samples_us) >= s.min_samples else s.timeout_s
            left_s = cap_s - wall_s
            n = _next_batch(samples_us, s, n, batch_call_s, left_s)
            if not samples_us and wall_s >= s.timeout_s:
                raise NotMeasurable(f"every call was starved by the host for {s.timeout_s:g} s "
                                    f"({starved} calls): the op cannot be fed fast enough to time its device work")
        import numpy as np

        api_calls = (("launches" if session.api_filter else "all") if isinstance(session, CuptiSession) else None)
        ids_refused = session.api_ids_refused if isinstance(session, CuptiSession) else None

        record = KernelsRecord(
            l2_state=self.flusher.state, flush_bytes=self.flusher.flush_bytes, flush_launch=self.flusher.launch,
            spin=s.spin, graph=self.graph, activity_source=batch.source if batch is not None else None,
            activity_fallback=fallback_reason(), activity_api_calls=api_calls, activity_api_ids_refused=ids_refused,
            batches=batches, batch_size=s.batch_size, starved_calls_dropped=starved,
            starved_gap_us=STARVED_GAP_NS / 1e3, spin_short_batches=spin_short, unattributed_activities=unattributed,
            spin_released_batches=released_batches, spin_release_unavailable=release_unavailable(),
            enqueue_us_per_call=enqueue_s * 1e6, pause_s=pause_s,
            busy_us_median=float(np.median(busy_us)) if busy_us else None,
            busy_samples_us=busy_us,          # per kept call, beside samples_us (the spans)
            gap_before_call_us_median=float(np.median(gaps_ns)) / 1e3 if gaps_ns else None,
            host_gaps_included=gaps_included, starved_calls_kept=starved_kept, late_launch_calls_kept=late_kept,
            window_start_s=wall0, activity_records_dropped=records_dropped, activity_forced_flushes=forced_flushes,
            queue_overflow_batches=overflowed_batches, queue_max_calls=max_calls,
            phases=KernelPhases(warmup_s=warm_s, batches_s=batches_s, spin_gpu_s=spin_gpu_s,
                                loop_s=time.perf_counter() - wall0))
        return Measurement(method=self.method, clock="device", samples_us=samples_us, summary=summarize(samples_us),
                           warmup_calls=calls, warmup_s=warm_s, stop_reason=reason, details=record,
                           last_batch=batch)
