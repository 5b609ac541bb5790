"""Host time per call: what the Python call costs on the CPU, measured with real launches.

The method of ROCm/aiter PR 6946, because an eager decode step can be host-bound (a 180 µs
Python path hiding a 3 µs kernel) and per-call timers cannot see that:
- warm each callable with untimed batches of real calls first (caches, autotuners, lazy init);
- time N batches (default 15) of B back-to-back calls (default 200) with the host clock;
  host µs per call = batch wall time / B. A batch amortizes the clock read, and back-to-back
  calls are how an eager model issues them;
- synchronize before and after each batch, outside the timed interval: the batch starts with
  an idle queue and its time never includes waiting for the GPU to finish;
- several callables (layers of one op, or the two sides of an A/B) are timed batch by batch in
  rotating order, so a drift in clocks or load hits them all alike;
- report the median of the batch values and their spread (IQR); keep every batch value.

Two traps are reported, never silently absorbed:
- `torch.set_default_device` (or `with torch.device(...)`) installs a TorchFunctionMode that
  intercepts every torch call from Python and inflates host time; `active_function_modes`
  names it and the measurement carries a warning;
- the launch queue: when the GPU is slower than the host, a batch ends with work still queued
  (`drain_us`, the time of the closing synchronize, is large) and a deep enough queue blocks the
  host, so the host time may include back-pressure. `gpu_paced` says so.

A batch during which the thread lost the CPU (another process ran on its core) measured the
scheduler. What "lost the CPU" means here (measure/cpu_contention.py, *thread* scope: the host
time of a Python call is the calling thread's work): the thread spent more than 5% of the batch's
wall time runnable on a run queue but not running (schedstat's run-queue wait). Waiting that is
part of the call, a launch blocked by a full queue or any other blocking wait, is not runnable
time, so a GPU op's call that waits is never taken for contention. Where schedstat is missing the
fallback compares thread CPU time with wall time; that cannot tell blocking from preemption, so
on CUDA a batch that ended with the GPU behind (blocking on the queue is possible) is not judged
by it. A contended batch is taken again (`preempt_retries`); every contended batch is left out of
the number and counted (`contended_batches_dropped`); with several callables the whole round
(batch i of each) goes, so their values stay paired (`rounds_dropped`). When no round was clean,
all are kept, the contended ones counted (`contended_batches_kept`) and flagged (`cpu_contended`,
with why).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from typing import Any, Literal, Optional

import numpy as np

from operatorx.measure.cpu_contention import ContentionCount, ContentionProbe
from operatorx.measure.measurement import Measurement
from operatorx.measure.record import HostTimeRecord
from operatorx.measure.stats import summarize

__all__ = ["HostTimeSettings", "HostTiming", "active_function_modes", "mode_warnings"]

Order = Literal["alternate", "fixed"]
#: A batch whose closing synchronize takes longer than this (µs), and longer than a tenth of the
#: batch, ended with the GPU still behind the host.
_DRAIN_FLOOR_US = 100.0


@dataclass(frozen=True, kw_only=True)
class HostTimeSettings:
    batches: int = 15
    """Timed batches per callable (rounds, one batch of each callable); the reported value is the
    median over them, less the rounds in which a batch lost the CPU (`rounds_dropped`)."""
    batch_calls: int = 200
    """Back-to-back calls per batch (B); host µs per call = batch wall time / B."""
    warmup_batches: int = 1
    """Untimed batches per callable before timing."""
    order: Order = "alternate"
    """`alternate`: the order of the callables rotates batch by batch; `fixed`: always as given."""
    preempt_retries: int = 2
    """Take a batch again (at most this many times) when the thread lost the CPU during it
    (measure/cpu_contention.py); a batch still contended after them is left out of the number."""
    max_wall_s: float = 10.0
    """Budget for the timed batches of one measurement. When the warmup shows that N batches of
    B calls would not fit (a slow call), B is reduced to fit and the reduction is recorded."""

    def __post_init__(self) -> None:
        for name in ("batches", "batch_calls"):
            if getattr(self, name) < 1:
                raise ValueError(f"host.{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup_batches < 0 or self.preempt_retries < 0 or self.max_wall_s <= 0:
            raise ValueError("host.warmup_batches and host.preempt_retries must be >= 0, host.max_wall_s > 0")
        if self.order not in ("alternate", "fixed"):
            raise ValueError(f"host.order must be alternate or fixed, got {self.order!r}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def active_function_modes() -> list[str]:
    """Class names of the TorchFunctionModes active now (each intercepts every torch call)."""
    try:
        from torch.overrides import _get_current_function_mode_stack
    except ImportError:  # pragma: no cover - very old torch
        return []
    return [type(m).__module__ + "." + type(m).__qualname__ for m in _get_current_function_mode_stack()]


def mode_warnings() -> list[str]:
    """Warnings for modes that inflate host time; empty when torch calls go straight through."""
    out = []
    for name in active_function_modes():
        if name.endswith("DeviceContext"):
            out.append("torch.set_default_device (or `with torch.device(...)`) is active: its "
                       f"TorchFunctionMode ({name}) intercepts every torch call and inflates host time")
        else:
            out.append(f"TorchFunctionMode {name} is active: it intercepts torch calls and inflates host time")
    return out


def _sync_for(device_kind: str) -> Callable[[], None]:
    if device_kind == "cuda":
        import torch

        return torch.cuda.synchronize
    return lambda: None


@dataclass(frozen=True)
class _Batch:
    issue_ns: int
    """Wall time of the timed calls."""
    drain_ns: int
    """Wall time of the closing synchronize (not counted)."""
    cpu_ns: int
    """The thread's CPU time during the timed calls."""
    contended: bool
    """The thread lost the CPU during the timed calls (measure/cpu_contention.py)."""
    lost_ns: int
    """Run-queue wait (fallback: wall time off the CPU) during the timed calls."""


def _drain_large(drain_ns: float, issue_ns: float) -> bool:
    """The closing synchronize waited noticeably: the GPU was still behind the host."""
    return drain_ns / 1e3 > max(_DRAIN_FLOOR_US, 0.1 * issue_ns / 1e3)


class HostTiming:
    """Host µs per call by alternating batches; one `Measurement` per callable (clock "host")."""

    method = "host_time/alternating_batches"

    def __init__(self, settings: HostTimeSettings, device_kind: str = "cpu", *, prefer_schedstat: bool = True):
        self.settings = settings
        self.device_kind = device_kind
        self._sync = _sync_for(device_kind)
        self._probe = ContentionProbe("thread", prefer_schedstat=prefer_schedstat)

    def measure(self, fn: Callable[[], Any]) -> Measurement[HostTimeRecord]:
        return self.measure_interleaved({"fn": fn})["fn"]

    def _batch(self, fn: Callable[[], Any], calls: int) -> _Batch:
        """The timed calls, then the closing synchronize (not counted), judged for contention."""
        sync, probe = self._sync, self._probe
        sync()
        before = probe.read()
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter_ns()
        after = probe.read()
        sync()
        drain_ns = time.perf_counter_ns() - t1
        contended, lost_ns = probe.judge(t1 - t0, before, after)
        if (contended and probe.signal != "schedstat_run_delay" and self.device_kind == "cuda"
                and _drain_large(drain_ns, t1 - t0)):
            contended = False        # CPU time cannot tell a launch blocked on a full queue from preemption
        return _Batch(t1 - t0, drain_ns, after.cpu_ns - before.cpu_ns, contended, lost_ns)

    def _timed_batch(self, fn: Callable[[], Any], calls: int, count: ContentionCount) -> tuple[_Batch, int]:
        """A batch, taken again (up to `preempt_retries` times) while the thread lost the CPU in it.

        Returns (the last batch, retries). Every batch taken is counted in `count`; the caller
        leaves a contended last batch out of the number unless no batch was clean.
        """
        retries = 0
        batch = self._batch(fn, calls)
        count.add(batch.contended, batch.issue_ns, batch.lost_ns)
        while batch.contended and retries < self.settings.preempt_retries:
            retries += 1
            batch = self._batch(fn, calls)
            count.add(batch.contended, batch.issue_ns, batch.lost_ns)
        return batch, retries

    def _orders(self, names: list[str]) -> list[list[str]]:
        if self.settings.order == "fixed" or len(names) < 2:
            return [names] * self.settings.batches
        return [names[i % len(names):] + names[:i % len(names)] for i in range(self.settings.batches)]

    def measure_interleaved(
        self,
        fns: Mapping[str, Callable[[], Any]],
        around: Optional[Mapping[str, Callable[[], AbstractContextManager[Any]]]] = None,
    ) -> dict[str, Measurement[HostTimeRecord]]:
        """Time each callable in `fns` by batches, the order rotating batch by batch.

        `around[name]()` gives a context entered around each of that callable's batches (a
        variant's settings); its cost is outside the timed interval.
        """
        names = list(fns)
        if not names:
            raise ValueError("nothing to time")
        around = around or {}
        with self._probe:                 # opened in this thread: the schedstat of the timing thread
            return self._interleaved(fns, names, around)

    def _interleaved(self, fns: Mapping[str, Callable[[], Any]], names: list[str],
                     around: Mapping[str, Callable[[], AbstractContextManager[Any]]]
                     ) -> dict[str, Measurement[HostTimeRecord]]:
        s = self.settings
        warnings: dict[str, list[str]] = {}

        def ctx(name: str) -> AbstractContextManager[Any]:
            return around[name]() if name in around else nullcontext()

        warm_ns = {n: 0 for n in names}
        per_call_ns = {n: 0.0 for n in names}
        probe_calls = 3                                       # a few calls first, to size the batches
        for name in names:
            with ctx(name):
                warnings[name] = mode_warnings()           # inside the context: a variant may set a mode
                probe = self._batch(fns[name], probe_calls)
            per_call_ns[name] = (probe.issue_ns + probe.drain_ns) / probe_calls
        # fit N batches (and the warmup) of every callable into the budget: a 50 ms call cannot
        # be called 3,000 times
        budget_calls = s.max_wall_s * 1e9 / max(1.0, sum(per_call_ns.values())) / (s.batches + s.warmup_batches)
        batch_calls = int(max(1, min(s.batch_calls, budget_calls)))
        warm_calls = batch_calls * s.warmup_batches
        for name in names if warm_calls else ():
            with ctx(name):
                warm = self._batch(fns[name], warm_calls)
            warm_ns[name] = warm.issue_ns + warm.drain_ns

        taken: dict[str, list[_Batch]] = {n: [] for n in names}
        counts = {n: self._probe.count() for n in names}
        retries = {n: 0 for n in names}
        first: list[str] = []
        for order in self._orders(names):
            first.append(order[0])
            for name in order:
                with ctx(name):
                    batch, r = self._timed_batch(fns[name], batch_calls, counts[name])
                taken[name].append(batch)
                retries[name] += r

        # a round (batch i of every callable) is left out when any of its batches lost the CPU, so
        # the callables' values stay paired batch by batch (run/ab.py pairs them); none clean: all kept
        clean_rounds = [i for i in range(s.batches) if not any(taken[n][i].contended for n in names)]
        rounds = clean_rounds or list(range(s.batches))
        out = {}
        for name in names:
            kept_batches = [taken[name][i] for i in rounds]
            kept_contended = sum(b.contended for b in kept_batches)
            samples_us = [b.issue_ns / batch_calls / 1e3 for b in kept_batches]
            drain_us = float(np.median([b.drain_ns for b in kept_batches])) / 1e3
            batch_us = float(np.median([b.issue_ns for b in kept_batches])) / 1e3
            v = counts[name].verdict("batches", dropped=counts[name].contended - kept_contended,
                                     kept=kept_contended, in_number=len(kept_batches))
            record = HostTimeRecord(
                batches=s.batches, batch_calls=batch_calls, order=s.order, variants=names,
                first_in_batch=first.count(name), drain_us_median=drain_us,
                gpu_paced=self.device_kind == "cuda" and _drain_large(drain_us * 1e3, batch_us * 1e3),
                warnings=[*warnings[name], *([v.why] if v.why is not None else [])],
                device_kind=self.device_kind,
                cpu_us_per_call=[b.cpu_ns / batch_calls / 1e3 for b in kept_batches],
                preempt_retries=retries[name], contention_flags=counts[name].flags,
                rounds_dropped=s.batches - len(rounds), contention_signal=v.signal,
                contended_batches_dropped=v.dropped, contended_batches_kept=v.kept,
                cpu_wait_fraction=v.wait_fraction, cpu_contended=v.contended, **v.why_field(),
                batch_calls_reduced_from=s.batch_calls if batch_calls < s.batch_calls else None,
                note="no GPU: host time is the whole call, compute included" if self.device_kind != "cuda" else None)
            out[name] = Measurement(method=self.method, clock="host", samples_us=samples_us,
                                    summary=summarize(samples_us), warmup_calls=warm_calls,
                                    warmup_s=warm_ns[name] / 1e9, stop_reason="batches", details=record)
        return out
