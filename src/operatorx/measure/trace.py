"""One batch of timed calls with CUPTI's activity records, and which device work was whose.

The records come from the process's activity session (measure/activity.py). The harness marks
its own host-side steps with ranges: `ox.spin` (the GPU spin that lets the
host enqueue ahead), `ox.flush` (the L2 flush) and `ox.call` (one call of the op). Every device
activity (kernel, memset, memcpy) carries the CUPTI correlation id of the runtime or driver API
call that launched it (`cudaLaunchKernel`, `cuLaunchKernelEx`, `cudaGraphLaunch`, ...); that
call happened on the host inside exactly one of the ranges. So a kernel belongs to call i
because it was *launched* inside call i's range — never because of its name: the op's own
`torch.zeros` fill counts, the harness's identical-looking fill does not.

A call is *starved* when the GPU sat idle before or inside it: one of its activities started
more than `STARVED_GAP_NS` after everything launched earlier had ended. The host had not kept
up (a multi-kernel op whose host code between kernels is slower than its kernels), and the
span would time the host. Starved calls are dropped from the samples and counted, and the
spin ahead of the next batch grows. A call is also counted *launched late* when one of its launch
calls returned on the host less than `LAUNCH_LEAD_NS` before everything launched earlier had ended
on the GPU (both clocks are CUPTI's): the host was only just ahead. That is recorded, not dropped.
Dropping such calls was tried: multi-kernel calls then lost about half their calls whatever the
spin, took far longer, and their spans moved between passes no less. An op that waits on
the GPU inside a call (a `.item()`) starves every call whatever the spin; the timer then keeps
such spans and says so.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["LAUNCH_LEAD_NS", "RANGE_CALL", "RANGE_FLUSH", "RANGE_SPIN", "STARVED_GAP_NS", "Activity", "CallTrace",
           "HostRange",
           "LaunchShape", "TraceBatch", "attribute", "attribute_launches", "run_marked_loop", "trace_batch"]

RANGE_SPIN, RANGE_FLUSH, RANGE_CALL = "ox.spin", "ox.flush", "ox.call"
_HARNESS_RANGES = (RANGE_SPIN, RANGE_FLUSH, RANGE_CALL)
#: Launch APIs are the CPU-side events whose names start so (CUDA runtime, CUDA driver, HIP).
_LAUNCH_API_PREFIXES = ("cu", "hip")
STARVED_GAP_NS = 5_000
LAUNCH_LEAD_NS = 5_000


HostRange = tuple[int, int, str]
"""A harness range on the host: (start ns, end ns, name), in the clock the launch records use."""


@dataclass(frozen=True)
class LaunchShape:
    """How a kernel was launched, from its CUPTI record (the breakdown shows it per kernel)."""
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    registers_per_thread: int
    static_shared_memory_bytes: int
    dynamic_shared_memory_bytes: int


@dataclass(frozen=True)
class Activity:
    """One device activity: a kernel, memset or memcpy."""
    name: str
    start_ns: int
    end_ns: int
    correlation_id: int
    shape: Optional[LaunchShape] = None
    """Kernels read from CUPTI directly carry it; Kineto's in-memory events do not."""

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class CallTrace:
    """The device activities one call launched, in start order."""
    activities: list[Activity] = field(default_factory=list)
    gap_before_ns: Optional[int] = None
    """Idle device time between the previous activity's end and this call's first start."""
    max_gap_ns: int = 0
    """The longest idle device time before or between this call's activities."""
    launched_late: int = 0
    """Activities whose launch call returned less than LAUNCH_LEAD_NS before the GPU was free for them."""

    @property
    def span_ns(self) -> int:
        """First start to last end: the call's device time, launch gaps between its kernels included."""
        if not self.activities:
            return 0
        return max(a.end_ns for a in self.activities) - self.activities[0].start_ns

    @property
    def busy_ns(self) -> int:
        """Time at least one of the call's activities ran (overlaps counted once)."""
        busy, reach = 0, None
        for a in self.activities:
            start = a.start_ns if reach is None else max(a.start_ns, reach)
            if a.end_ns > start:
                busy += a.end_ns - start
            reach = a.end_ns if reach is None else max(reach, a.end_ns)
        return busy

    @property
    def starved(self) -> bool:
        return self.max_gap_ns > STARVED_GAP_NS


@dataclass
class TraceBatch:
    calls: list[CallTrace]
    harness_activities: int
    """Flush and spin activities seen (excluded from every call)."""
    unattributed: int
    """Device activities that could not be tied to a range: a sign of work launched from another thread."""
    enqueue_s_per_call: float
    """Host seconds per iteration (flush + call) under the profiler, to size the next spin."""
    profiler: Any = None
    """The torch.profiler object (Kineto source only), kept for launch shapes and `--trace` export."""
    source: str = "kineto"
    """Which records: `cupti-python` (one CUPTI session for the process) or `kineto` (torch.profiler)."""
    records_dropped: int = 0
    """Device records CUPTI delivered incomplete or undecodable (CUPTI source): some call's span may
    miss a kernel, so the row counts them."""
    queue_left_ns: Optional[int] = None
    """GPU time still queued when the host had enqueued the batch's last call: the last device
    activity's end minus the host's end of the loop, in the records' clock (CUPTI source). The
    spin ahead of the next batch is sized from it (measure/kernel_timing.py)."""
    forced_flush: bool = False
    """CUPTI source: the batch's records were taken with CUPTI's forced flush (measure/activity.py
    `CuptiSession._attributed`): the quick one left something unpaired or a call short, or CUPTI
    records every API call."""


def attribute_launches(ranges: Sequence[HostRange], device: Sequence[tuple[Activity, Optional[int]]],
                       launch_end: Optional[Sequence[Optional[int]]] = None) -> tuple[list[CallTrace], int, int]:
    """(calls, harness activity count, unattributed count): each device activity, given the host
    time of the API call that launched it (None when unknown), goes to the range that call lies in.
    `launch_end`, beside `device`: when each launch call returned (None: unknown), for the late
    launch rule.

    The one rule both record sources share (CUPTI records read directly, or Kineto's events): a
    kernel belongs to call i because it was launched inside call i's range.
    """
    ordered = sorted(ranges)
    starts = [r[0] for r in ordered]
    call_of: list[int] = []
    n_calls = 0
    for _, _, name in ordered:
        call_of.append(n_calls if name == RANGE_CALL else -1)
        n_calls += name == RANGE_CALL
    calls = [CallTrace() for _ in range(n_calls)]
    owner: dict[int, int] = {}          # index in `device` -> call index, or -1 for harness
    harness = unattributed = 0
    for i, (act, at) in enumerate(device):
        k = bisect.bisect_right(starts, at) - 1 if at is not None else -1
        if at is None or k < 0 or at > ordered[k][1]:
            unattributed += 1
            continue
        call = call_of[k]
        owner[i] = call
        if call < 0:
            harness += 1
        else:
            calls[call].activities.append(act)
    # idle device time before each activity: its start minus the latest end of anything that started earlier
    order = sorted(range(len(device)), key=lambda i: device[i][0].start_ns)
    reach: Optional[int] = None
    first_seen: set[int] = set()
    for i in order:
        act = device[i][0]
        owned = owner.get(i)
        if owned is not None and owned >= 0 and reach is not None:
            gap = max(0, act.start_ns - reach)
            if owned not in first_seen:
                calls[owned].gap_before_ns = gap
            calls[owned].max_gap_ns = max(calls[owned].max_gap_ns, gap)
            returned = launch_end[i] if launch_end is not None else None
            if returned is not None and returned > reach - LAUNCH_LEAD_NS:
                calls[owned].launched_late += 1
        if owned is not None and owned >= 0:
            first_seen.add(owned)
        reach = act.end_ns if reach is None else max(reach, act.end_ns)
    for c in calls:
        c.activities.sort(key=lambda a: a.start_ns)
    return calls, harness, unattributed


def attribute(events: Iterable[Any], cpu: Any, cuda: Any) -> tuple[list[CallTrace], int, int]:
    """`attribute_launches` over Kineto events.

    `events` are torch's `_KinetoEvent`s (or anything with the same methods): name(),
    device_type(), correlation_id(), linked_correlation_id(), start_ns(), end_ns(),
    is_user_annotation(). Host ops and runtime calls have separate id spaces, hence two maps: a
    kernel whose launch record is missing falls back to the host op that launched it.
    """
    events = list(events)
    ranges = [(e.start_ns(), e.end_ns(), e.name()) for e in events
              if e.device_type() == cpu and e.is_user_annotation() and e.name() in _HARNESS_RANGES]
    launch_at: dict[int, int] = {}
    launch_end: dict[int, int] = {}
    op_at: dict[int, int] = {}
    device: list[tuple[Activity, int]] = []
    linked: dict[int, int] = {}
    for e in events:
        if e.is_user_annotation():
            continue
        if e.device_type() == cuda:
            device.append((Activity(e.name(), e.start_ns(), e.end_ns(), e.correlation_id()), 0))
            linked[e.correlation_id()] = e.linked_correlation_id()
            continue
        if e.device_type() != cpu:
            continue
        if e.name().startswith(_LAUNCH_API_PREFIXES):
            launch_at[e.correlation_id()] = e.start_ns()
            launch_end[e.correlation_id()] = e.end_ns()
        else:
            op_at[e.correlation_id()] = e.start_ns()
    resolved: list[tuple[Activity, Optional[int]]] = []
    for act, _ in device:
        at = launch_at.get(act.correlation_id)
        resolved.append((act, at if at is not None else op_at.get(linked.get(act.correlation_id, 0))))
    return attribute_launches(ranges, resolved, [launch_end.get(act.correlation_id) for act, _ in device])


def run_marked_loop(mark: Callable[[str], AbstractContextManager[Any]], call: Callable[[], Any], n: int,
                    flush: Optional[Callable[[], None]], spin_cycles: int, pause_s: float = 0.0,
                    pause_spin_cycles: int = 0, released: bool = False) -> float:
    """The host side of one batch, the same whatever records it: `n` iterations of [flush, call],
    each step inside its harness range (`mark(name)`), behind one GPU spin. Returns the host
    seconds per iteration (to size the next spin); the caller synchronizes.

    `released`: the spin is a wait that the host ends right after its last launch
    (measure/host_release.py), `spin_cycles` being only its longest; where that wait cannot run,
    the fixed spin of `spin_cycles`. With `pause_s` > 0 each iteration is its own short queue
    (spin, flush, call, synchronize, sleep): the GPU rests between calls, as the throttle retry
    wants, and the first spin is never released (a synchronize behind a held wait would sit out
    its whole length).
    """
    import time

    import torch

    from operatorx.measure.host_release import host_release

    waiting = host_release() if released and spin_cycles > 0 and pause_s <= 0 else None
    try:
        if spin_cycles > 0:
            with mark(RANGE_SPIN):
                if waiting is not None:
                    waiting.hold(spin_cycles)
                else:
                    torch.cuda._sleep(spin_cycles)
        t0 = time.perf_counter()
        for _ in range(n):
            if pause_s > 0 and pause_spin_cycles > 0:
                with mark(RANGE_SPIN):
                    torch.cuda._sleep(pause_spin_cycles)
            if flush is not None:
                with mark(RANGE_FLUSH):
                    flush()
            with mark(RANGE_CALL):
                call()
            if pause_s > 0:
                torch.cuda.synchronize()
                time.sleep(pause_s)
        return (time.perf_counter() - t0) / n
    finally:
        if waiting is not None:
            waiting.release()           # after the last launch, or on an error (never a GPU left waiting)


def trace_batch(call: Callable[[], Any], n: int, flush: Optional[Callable[[], None]], spin_cycles: int,
                pause_s: float = 0.0, pause_spin_cycles: int = 0, released: bool = False) -> TraceBatch:
    """Run `n` iterations of [flush, call] with device activity recorded, and attribute it: through
    the process's activity session (measure/activity.py: CUPTI kept open, or one Kineto session
    per batch where cupti-python is missing). `released`: see `run_marked_loop`."""
    from operatorx.measure.activity import activity_session

    return activity_session().batch(call, n, flush, spin_cycles, pause_s, pause_spin_cycles, released)
