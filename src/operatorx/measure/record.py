"""What a timer saw while it took its samples: one typed, closed record per timer.

A timer returns its record as `Measurement.details`; `run/` stores a row timer's record flat in the
row's `metrics.timing` (result_parts.TimingInfo, where each key's meaning is written) and reads
the host timer's for `metrics.host`. Every record is closed (`extra="forbid"`): a key a timer adds
without declaring it fails where it is made, never reaching a stored row undocumented. A new key is
one field here (optional, default None, so older producers and tests need no change) and its
description in the row part that stores it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Optional, TypeVar

from pydantic import BaseModel, ConfigDict

__all__ = ["Record", "TimerRecord", "DeviceRecord", "EventsRecord", "KernelsRecord", "KernelPhases",
           "HostClockRecord", "HostTimeRecord", "CONTENTION_KEYS"]


_R = TypeVar("_R", bound="Record")


class Record(BaseModel):
    """A timer's record: typed, closed, immutable."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def stored(self) -> dict[str, Any]:
        """The keys the timer gave, as a row stores them: a key the timer left out is not written
        (a `cpu_contended_why` only when there is a why), one it gave as None is."""
        return self.model_dump(exclude_unset=True)

    def model_copy(self: _R, *, update: Optional[Mapping[str, Any]] = None, deep: bool = False) -> _R:
        """A copy with `update` validated like a new record: pydantic's own copy takes any key and
        value unchecked, and a record must stay closed and typed however it is made."""
        if not update:
            return super().model_copy(deep=deep)
        given = {name: getattr(self, name) for name in self.model_fields_set}
        return self.model_validate({**given, **update})


class TimerRecord(Record):
    """What every row timer (`run`'s device or CPU timer) says; run/ and measure/retry.py read these."""

    l2_state: str
    """The L2 state each timed call started in (measure/l2.py `L2_STATES`); `n/a (cpu)` on the CPU."""
    spin: bool
    """Whether a GPU wait was queued ahead of the batches (settings `spin`; never on the CPU)."""
    pause_s: Optional[float] = None
    """The pause after each timed call that the timer really made: a long call is rested from its
    first attempt even when no pause was asked (settings.rested_pause_s)."""
    window_start_s: Optional[float] = None
    """`time.perf_counter()` when the timed window began: the telemetry summary starts there."""
    busy_us_median: Optional[float] = None
    """Median time some kernel of a kept call ran; None where the timer cannot tell."""
    busy_samples_us: Optional[list[float]] = None
    """Busy time of each kept call, beside `samples_us` (the spans); None where not known."""


class DeviceRecord(TimerRecord):
    """A CUDA timer's record: the L2 flush it made and how the host kept ahead of the GPU."""

    flush_bytes: int
    flush_launch: Literal["cuda_graph", "eager"]
    batch_size: int
    enqueue_us_per_call: float
    spin_short_batches: int


class EventsRecord(DeviceRecord):
    """`--timing events`: a CUDA event pair around each call (measure/events.py)."""

    spins: int


class KernelPhases(Record):
    """Seconds of one kernels/graph attempt, by phase."""

    warmup_s: float
    batches_s: float
    spin_gpu_s: float
    loop_s: float


class KernelsRecord(DeviceRecord):
    """`--timing kernels|graph`: each call's span from CUPTI's kernel records (measure/kernel_timing.py)."""

    graph: bool
    activity_source: Optional[str]
    activity_fallback: Optional[str]
    activity_api_calls: Optional[str]
    activity_api_ids_refused: Optional[int]
    batches: int
    starved_calls_dropped: int
    starved_calls_kept: int
    starved_gap_us: float
    late_launch_calls_kept: int
    host_gaps_included: bool
    unattributed_activities: int
    spin_released_batches: int
    spin_release_unavailable: Optional[str]
    gap_before_call_us_median: Optional[float]
    activity_records_dropped: int
    activity_forced_flushes: int
    queue_overflow_batches: int
    queue_max_calls: Optional[int]
    phases: KernelPhases


class HostClockRecord(TimerRecord):
    """The CPU device's host clock (measure/host_clock.py): how samples that lost the CPU were judged."""

    contention_signal: str
    contended_samples_dropped: int
    contended_samples_kept: int
    cpu_wait_fraction: Optional[float]
    cpu_contended: bool
    cpu_contended_why: Optional[str] = None


CONTENTION_KEYS = ("contention_signal", "contended_batches_dropped", "contended_batches_kept", "rounds_dropped",
                   "cpu_wait_fraction", "cpu_contended", "cpu_contended_why")
"""What the host timer says about batches that lost the CPU: each `metrics.host` entry carries them."""


class HostTimeRecord(Record):
    """Host time per call by alternating batches (measure/host_time.py), one per callable timed."""

    batches: int
    batch_calls: int
    """Calls per batch used; fewer than the settings' when the budget (`max_wall_s`) made it so."""
    batch_calls_reduced_from: Optional[int] = None
    """The settings' calls per batch, when `batch_calls` was reduced from it."""
    order: Literal["alternate", "fixed"]
    variants: list[str]
    first_in_batch: int
    """Rounds in which this callable went first."""
    drain_us_median: float
    """Median wall time of the synchronize closing each batch (not counted in the host time)."""
    gpu_paced: bool
    """The GPU was still behind the host at the end of the batches: host time may include back-pressure."""
    warnings: list[str]
    device_kind: str
    note: Optional[str] = None
    cpu_us_per_call: list[float]
    """The thread's CPU time per call, per kept batch."""
    preempt_retries: int
    contention_flags: list[bool]
    """Per batch taken (retakes included), in order: whether it lost the CPU."""
    rounds_dropped: int
    contention_signal: str
    contended_batches_dropped: int
    contended_batches_kept: int
    cpu_wait_fraction: Optional[float]
    cpu_contended: bool
    cpu_contended_why: Optional[str] = None

    def contention(self) -> dict[str, Any]:
        """The contention keys (`CONTENTION_KEYS`) as `metrics.host` stores them."""
        return self.model_dump(include=set(CONTENTION_KEYS), exclude_unset=True)
