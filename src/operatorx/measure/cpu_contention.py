"""Did a host-clock sample lose the CPU? The signal the host timers use to drop contended samples.

A host-clock sample is the wall time around a call. On a busy machine (other processes on the
same cores) the timing thread can be runnable but not running for part of that interval: the
sample then measures the scheduler, not the call. Its spread inside one run does not show this
(every sample of a run on a loaded machine is slowed alike: 7,985 µs ± 0.5% for a ~500 µs call),
so each sample is judged on its own, the way a starved GPU call is:

- **schedstat** (Linux, preferred): field 2 of `/proc/thread-self/schedstat` is the time the
  thread spent on a run queue waiting for a CPU, in ns (`sched_info.run_delay`). That is exactly
  "runnable but not running". A sample is contended when its run-queue wait exceeds
  `CONTENDED_WAIT_FRACTION` of its wall time. Time spent blocked (sleeping, waiting on a GPU
  synchronize, a lock, I/O) is not run-queue wait, so a call that legitimately waits is not
  called contended for waiting; only the queueing after it wakes, which is contention too, counts.
  The kernel adds a wait to `run_delay` when the thread gets the CPU back, so a read made by the
  running thread after the call includes every wait inside it; a wait while the counters
  themselves were read (outside the timed interval) is taken off (`CpuStamp.start_ns`).
- **CPU time** (fallback where schedstat is missing): a sample is contended when its wall time
  exceeds the CPU time used in it by more than `CONTENDED_WAIT_FRACTION` of the wall time and
  more than `_FALLBACK_SLACK_NS` (the clock reads themselves cost CPU-time-less wall time). This
  cannot tell waiting for a CPU from blocking, so it is right only for calls that do not block;
  the timers say which signal they used (`contention_signal`).

Two scopes, because the two host timers time different things:
- `thread`: the calling thread only (`run --host`: the Python path of one call is that thread's
  work; the fallback is `time.thread_time_ns`).
- `process`: the calling thread and the threads that worked with it (the CPU device: torch runs
  an op's compute on its intra-op threads too, and a starved worker delays the call as much as a
  starved caller). A thread other than the caller counts when it used at least
  `_WORKER_CPU_FRACTION` of the sample's wall time in CPU: an idle helper thread (a sampler, a
  pool waiting for work) that woke up and queued for a moment did not delay the call, and the
  kernel books a wait when it ends, so a helper's wait that began long before the sample would
  otherwise land in it. A worker's wait is capped at the sample's wall time for the same reason.
  A worker that got no CPU at all during the sample is not seen (its wait is booked later); the
  caller then waits at the join, blocked, which schedstat does not count.
  The fallback is `time.process_time_ns` (all threads' CPU), which is conservative: k busy
  threads use k × wall of CPU, so only a call whose threads together got less than one CPU's
  worth of the interval is flagged.

What neither sees: time the hypervisor takes the whole virtual CPU away (steal time), which is
invisible inside the guest's scheduler accounting.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Literal, Optional, TypedDict

__all__ = ["CONTENDED_WAIT_FRACTION", "CpuStamp", "ContentionProbe", "ContentionCount", "Contention", "Scope",
           "Signal", "schedstat_available"]

Scope = Literal["thread", "process"]
Signal = Literal["schedstat_run_delay", "thread_cpu_time", "process_cpu_time"]

#: A sample whose run-queue wait (or, in the fallback, wall time not spent on the CPU) exceeds this
#: fraction of its wall time measured the scheduler: 5% is above the few-µs jitter of a wake-up
#: and far below what one lost time slice (0.7–3 ms) does to any call shorter than the slice.
CONTENDED_WAIT_FRACTION = 0.05
#: The fallback's absolute slack: CPU time and wall time are read by different clocks, and reading
#: them costs wall time that a tiny call would see as "lost".
_FALLBACK_SLACK_NS = 20_000
#: A measurement is `cpu_contended` when more than this fraction of its samples were contended.
MOSTLY = 0.5
#: Process scope: a thread other than the caller is one of the call's workers when it used at least
#: this fraction of the sample's wall time in CPU.
_WORKER_CPU_FRACTION = 0.25

_SCHEDSTAT = "/proc/thread-self/schedstat"


def _schedstat(fd: int) -> tuple[int, int]:
    """(ns on the CPU, ns runnable on a run queue but not running): fields 1 and 2 of a schedstat file."""
    fields = os.pread(fd, 128, 0).split()
    return int(fields[0]), int(fields[1])


def schedstat_available() -> bool:
    """Whether this kernel gives per-thread run-queue wait (Linux with sched_info; zeros mean off)."""
    try:
        with open(_SCHEDSTAT, "rb") as f:
            fields = f.read().split()
    except OSError:
        return False
    # "0 0 0" is what a kernel without sched_info writes; a thread that has run has a nonzero field 1
    return len(fields) >= 3 and fields != [b"0", b"0", b"0"]


@dataclass(frozen=True)
class CpuStamp:
    """The counters read just before or just after a timed interval (outside it)."""

    wait_ns: int
    """The calling thread's run-queue wait so far (0 in the fallback)."""
    cpu_ns: int
    """CPU time so far of the scope (the thread, or all threads of the process)."""
    others: tuple[tuple[int, int], ...] = ()
    """Process scope: (ns on the CPU, run-queue wait ns) of each other thread, in a fixed order."""
    start_ns: Optional[int] = None
    """perf_counter_ns when the read began, and when it ended: a wait while reading is not the call's."""
    end_ns: Optional[int] = None


@dataclass
class ContentionCount:
    """Per-measurement tally: how many samples were judged, how many contended, and the wait."""

    signal: Signal
    scope: Scope
    samples: int = 0
    contended: int = 0
    wall_ns: int = 0
    lost_ns: int = 0
    flags: list[bool] = field(default_factory=list)

    def add(self, contended: bool, wall_ns: int, lost_ns: int) -> None:
        self.samples += 1
        self.contended += contended
        self.wall_ns += wall_ns
        self.lost_ns += max(0, lost_ns)
        self.flags.append(contended)

    @property
    def mostly_contended(self) -> bool:
        return self.samples > 0 and self.contended > MOSTLY * self.samples

    @property
    def wait_fraction(self) -> Optional[float]:
        """Run-queue wait (fallback: wall time off the CPU) over the wall time of all judged samples."""
        return self.lost_ns / self.wall_ns if self.wall_ns > 0 else None

    def verdict(self, unit: str, dropped: int, kept: int, in_number: int,
                no_clean_set: Optional[str] = None) -> Contention:
        """What the measurement's number is worth against the CPU (`unit` is "samples" or "batches").

        `dropped`: contended samples left out of the number; `kept`: contended samples in it (there
        was no clean set to report); `in_number`: samples the number is taken from; `no_clean_set`:
        why the clean ones alone could not give the number, in words, where it is not that there
        were none (the host clock: fewer than `min_samples`)."""
        contended = self.mostly_contended or kept > 0
        what = (f"{'run-queue wait' if self.signal == 'schedstat_run_delay' else 'wall time off the CPU'} > "
                f"{CONTENDED_WAIT_FRACTION:.0%} of their wall time, {self.signal}")
        why = None
        if kept > 0:
            which = f"all {kept}" if kept == in_number else f"{kept} of the {in_number}"
            left = no_clean_set or "no clean set was left"
            why = (f"{which} {unit} the number is taken from lost the CPU ({what}) and {left}: "
                   "the number is kept but includes waiting for a CPU on a busy machine")
        elif contended:
            why = (f"{self.contended} of {self.samples} {unit} taken lost the CPU ({what}) and "
                   "were dropped: the machine was busy; the number is from the clean ones")
        return Contention(signal=self.signal, dropped=dropped, kept=kept, wait_fraction=self.wait_fraction,
                          contended=contended, why=why)


@dataclass(frozen=True)
class Contention:
    """A measurement's verdict against the CPU; the timers' records carry it under their unit's names
    (`contended_samples_dropped`, `contended_batches_dropped`, ...)."""

    signal: Signal
    dropped: int
    """Contended samples left out of the number."""
    kept: int
    """Contended samples in the number (no clean set was left)."""
    wait_fraction: Optional[float]
    """Run-queue wait (fallback: wall time off the CPU) over the wall time of all judged samples."""
    contended: bool
    """More than half the samples lost the CPU, or the number includes contended ones."""
    why: Optional[str]
    """What `contended` means for the number, in words; None when not contended."""

    def why_field(self) -> ContendedWhy:
        """`{"cpu_contended_why": ...}` when contended, else nothing: a clean row stores no such key."""
        return {"cpu_contended_why": self.why} if self.why is not None else {}


class ContendedWhy(TypedDict, total=False):
    """The why of a contended measurement, as the timers' records take it (absent when clean)."""

    cpu_contended_why: str


class ContentionProbe:
    """Reads the counters around each timed interval and judges the interval.

    Use as a context manager in the thread that times the calls (the schedstat files are opened
    for that thread). Process scope lists the process's threads when entered: threads started
    later (an intra-op pool created by the first call) are not watched, so enter after warmup.
    """

    def __init__(self, scope: Scope, *, prefer_schedstat: bool = True):
        self.scope: Scope = scope
        self._caller: Optional[int] = None
        self._fds: list[int] = []
        use = prefer_schedstat and schedstat_available()
        self.signal: Signal = "schedstat_run_delay" if use else (
            "thread_cpu_time" if scope == "thread" else "process_cpu_time")
        self._cpu = time.thread_time_ns if scope == "thread" else time.process_time_ns

    def __enter__(self) -> ContentionProbe:
        if self.signal == "schedstat_run_delay":
            self._caller = os.open(_SCHEDSTAT, os.O_RDONLY)
            me = str(threading.get_native_id())
            for tid in os.listdir("/proc/self/task") if self.scope == "process" else ():
                if tid == me:
                    continue
                try:
                    self._fds.append(os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY))
                except OSError:               # a thread that ended between the listing and the open
                    continue
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in [*self._fds, *([self._caller] if self._caller is not None else [])]:
            os.close(fd)
        self._fds, self._caller = [], None

    def count(self) -> ContentionCount:
        return ContentionCount(signal=self.signal, scope=self.scope)

    def read(self) -> CpuStamp:
        start = time.perf_counter_ns()
        if self._caller is None:
            return CpuStamp(wait_ns=0, cpu_ns=self._cpu())
        others = []
        for fd in self._fds:
            try:
                others.append(_schedstat(fd))
            except (OSError, ValueError, IndexError):   # the thread ended: it no longer works on calls
                others.append((0, 0))
        wait = _schedstat(self._caller)[1]
        return CpuStamp(wait_ns=wait, cpu_ns=self._cpu(), others=tuple(others), start_ns=start,
                        end_ns=time.perf_counter_ns())

    def judge(self, wall_ns: int, before: CpuStamp, after: CpuStamp) -> tuple[bool, int]:
        """(contended, ns lost to the scheduler) for an interval of `wall_ns` between two reads."""
        if self.signal == "schedstat_run_delay":
            # the caller's wait while the stamps were read is outside the timed interval: what is
            # left after taking that time off is a lower bound of its wait inside the call
            reading = 0
            if after.end_ns is not None and before.start_ns is not None:
                reading = after.end_ns - before.start_ns - wall_ns
            wait = max(0, after.wait_ns - before.wait_ns - max(0, reading))
            for (cpu0, wait0), (cpu1, wait1) in zip(before.others, after.others, strict=True):
                if cpu1 - cpu0 >= _WORKER_CPU_FRACTION * wall_ns:     # it worked on the call
                    wait += max(0, min(wait1 - wait0, wall_ns))
            return wait > CONTENDED_WAIT_FRACTION * wall_ns, wait
        lost = wall_ns - (after.cpu_ns - before.cpu_ns)
        return lost > max(_FALLBACK_SLACK_NS, CONTENDED_WAIT_FRACTION * wall_ns), lost
