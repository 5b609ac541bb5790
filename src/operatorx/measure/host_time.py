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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from typing import Any, Literal, Optional

import numpy as np

from operatorx.measure.measurement import Measurement
from operatorx.measure.stats import summarize

__all__ = ["HostTimeSettings", "HostTiming", "active_function_modes", "mode_warnings"]

Order = Literal["alternate", "fixed"]
#: A batch whose closing synchronize takes longer than this (µs), and longer than a tenth of the
#: batch, ended with the GPU still behind the host.
_DRAIN_FLOOR_US = 100.0
#: A batch is "preempted" when its wall time exceeds the thread's CPU time by more than both of these.
_PREEMPT_SLACK_NS = 20_000
_PREEMPT_REL = 0.05


@dataclass(frozen=True, kw_only=True)
class HostTimeSettings:
    batches: int = 15
    """Timed batches per callable; the reported value is the median over them."""
    batch_calls: int = 200
    """Back-to-back calls per batch (B); host µs per call = batch wall time / B."""
    warmup_batches: int = 1
    """Untimed batches per callable before timing."""
    order: Order = "alternate"
    """`alternate`: the order of the callables rotates batch by batch; `fixed`: always as given."""
    preempt_retries: int = 2
    """Take a batch again (at most this many times) when the thread lost the CPU during it."""
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


def _preempted(wall_ns: int, cpu_ns: int) -> bool:
    """The thread was off the CPU for a noticeable part of the interval (another process ran)."""
    return wall_ns - cpu_ns > max(_PREEMPT_SLACK_NS, _PREEMPT_REL * wall_ns)


class HostTiming:
    """Host µs per call by alternating batches; one `Measurement` per callable (clock "host")."""

    method = "host_time/alternating_batches"

    def __init__(self, settings: HostTimeSettings, device_kind: str = "cpu"):
        self.settings = settings
        self.device_kind = device_kind
        self._sync = _sync_for(device_kind)

    def measure(self, fn: Callable[[], Any]) -> Measurement:
        return self.measure_interleaved({"fn": fn})["fn"]

    def _batch(self, fn: Callable[[], Any], calls: int) -> tuple[int, int, int]:
        """(issue ns, drain ns, thread CPU ns): the timed calls, then the closing synchronize (not counted)."""
        sync = self._sync
        sync()
        c0 = time.thread_time_ns()
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter_ns()
        c1 = time.thread_time_ns()
        sync()
        return t1 - t0, time.perf_counter_ns() - t1, c1 - c0

    def _timed_batch(self, fn: Callable[[], Any], calls: int) -> tuple[int, int, int, int]:
        """A batch, taken again (up to `preempt_retries` times) while the thread lost the CPU in it.

        Returns (issue ns, drain ns, CPU ns, retries). A batch whose wall time exceeds the thread's
        CPU time measured the scheduler; one that is still preempted after the retries is kept.
        """
        retries = 0
        issue_ns, drain_ns, cpu_ns = self._batch(fn, calls)
        while _preempted(issue_ns, cpu_ns) and retries < self.settings.preempt_retries:
            retries += 1
            issue_ns, drain_ns, cpu_ns = self._batch(fn, calls)
        return issue_ns, drain_ns, cpu_ns, retries

    def _orders(self, names: list[str]) -> list[list[str]]:
        if self.settings.order == "fixed" or len(names) < 2:
            return [names] * self.settings.batches
        return [names[i % len(names):] + names[:i % len(names)] for i in range(self.settings.batches)]

    def measure_interleaved(
        self,
        fns: Mapping[str, Callable[[], Any]],
        around: Optional[Mapping[str, Callable[[], AbstractContextManager[Any]]]] = None,
    ) -> dict[str, Measurement]:
        """Time each callable in `fns` by batches, the order rotating batch by batch.

        `around[name]()` gives a context entered around each of that callable's batches (a
        variant's settings); its cost is outside the timed interval.
        """
        s = self.settings
        names = list(fns)
        if not names:
            raise ValueError("nothing to time")
        around = around or {}
        warnings: dict[str, list[str]] = {}

        def ctx(name: str) -> AbstractContextManager[Any]:
            return around[name]() if name in around else nullcontext()

        warm_ns = {n: 0 for n in names}
        per_call_ns = {n: 0.0 for n in names}
        probe_calls = 3                                       # a few calls first, to size the batches
        for name in names:
            with ctx(name):
                warnings[name] = mode_warnings()           # inside the context: a variant may set a mode
                issue_ns, drain_ns, _ = self._batch(fns[name], probe_calls)
            per_call_ns[name] = (issue_ns + drain_ns) / probe_calls
        # fit N batches (and the warmup) of every callable into the budget: a 50 ms call cannot
        # be called 3,000 times
        budget_calls = s.max_wall_s * 1e9 / max(1.0, sum(per_call_ns.values())) / (s.batches + s.warmup_batches)
        batch_calls = int(max(1, min(s.batch_calls, budget_calls)))
        warm_calls = batch_calls * s.warmup_batches
        for name in names if warm_calls else ():
            with ctx(name):
                issue_ns, drain_ns, _ = self._batch(fns[name], warm_calls)
            warm_ns[name] = issue_ns + drain_ns

        issue: dict[str, list[int]] = {n: [] for n in names}
        drain: dict[str, list[int]] = {n: [] for n in names}
        cpu: dict[str, list[int]] = {n: [] for n in names}
        retries = {n: 0 for n in names}
        first: list[str] = []
        for order in self._orders(names):
            first.append(order[0])
            for name in order:
                with ctx(name):
                    i_ns, d_ns, c_ns, r = self._timed_batch(fns[name], batch_calls)
                issue[name].append(i_ns)
                drain[name].append(d_ns)
                cpu[name].append(c_ns)
                retries[name] += r

        out = {}
        for name in names:
            samples_us = [ns / batch_calls / 1e3 for ns in issue[name]]
            drain_us = float(np.median(drain[name])) / 1e3
            batch_us = float(np.median(issue[name])) / 1e3
            details: dict[str, Any] = {
                "batches": s.batches, "batch_calls": batch_calls, "order": s.order, "variants": names,
                "first_in_batch": first.count(name), "drain_us_median": drain_us,
                "gpu_paced": self.device_kind == "cuda" and drain_us > max(_DRAIN_FLOOR_US, 0.1 * batch_us),
                "warnings": warnings[name], "device_kind": self.device_kind,
                "cpu_us_per_call": [ns / batch_calls / 1e3 for ns in cpu[name]],
                "preempt_retries": retries[name],
                "preempted_batches": sum(_preempted(w, c) for w, c in zip(issue[name], cpu[name], strict=True)),
            }
            if details["preempted_batches"] * 4 > s.batches:
                details["warnings"] = [*warnings[name], f"the thread lost the CPU in {details['preempted_batches']} "
                                       f"of {s.batches} batches: host time includes time off the CPU "
                                       "(a busy machine); cpu_us_per_call is the CPU the calls used"]
            if batch_calls < s.batch_calls:
                details["batch_calls_reduced_from"] = s.batch_calls
            if self.device_kind != "cuda":
                details["note"] = "no GPU: host time is the whole call, compute included"
            out[name] = Measurement(method=self.method, clock="host", samples_us=samples_us,
                                    summary=summarize(samples_us), warmup_calls=warm_calls,
                                    warmup_s=warm_ns[name] / 1e9, stop_reason="batches", details=details)
        return out
