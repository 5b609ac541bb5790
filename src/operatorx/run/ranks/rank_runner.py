"""One rank's part of a multi-rank case, in a worker: refusals → prepare → check → timing → (rank 0) the row.

Every rank runs the same steps in the same order; after each step the ranks tell each other how it
went (`_agree`), so a rank that refuses or fails stops all of them at that step, and the case's one
row names that rank. A failure inside a collective (a dead or hung peer) surfaces as the group's
timeout, which the parent bounded by the case's deadline; that rank's group is then unusable and
its worker asks to be replaced (`RankResult.broken`).
"""

from __future__ import annotations

import time
import traceback
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from operatorx.backends import Unsupported, get_backend
from operatorx.backends.ranked import RankedBackend, RankPrepared
from operatorx.backends.refusal import library_refusal
from operatorx.measure import loop
from operatorx.measure.rank_timing import (
    CudaIterationClock,
    HostIterationClock,
    IterationClock,
    KernelIterationClock,
    RankAttempts,
    RankMeasurement,
    measure_ranks_with_retries,
)
from operatorx.result import (
    CaseSeconds,
    CheckResult,
    Conditions,
    ErrorKind,
    Measured,
    Peak,
    Row,
    Summary,
    Telemetry,
    TimingInfo,
    Warmup,
    json_safe,
)
from operatorx.result_ranks import KERNELS_RECORDED, NO_KERNELS_CPU, NO_KERNELS_EVENTS, RankLine, Ranks
from operatorx.run.case import _peak, case_rates
from operatorx.run.case_gate import case_refusal
from operatorx.run.faults import classify_message
from operatorx.run.ranks.assignment import RankAssignment
from operatorx.run.ranks.faults import RankFault, rank_fault
from operatorx.run.ranks.group import RankGroup, ensure_group
from operatorx.spec import Case

if TYPE_CHECKING:
    from operatorx.backends import Check
    from operatorx.run.case import CaseRunner

__all__ = ["RankResult", "run_rank_case"]


@dataclass
class RankResult:
    """What one rank made of the case: its status, and the case's row on rank 0."""

    rank: int
    status: str
    message: Optional[str] = None
    error_kind: Optional[ErrorKind] = None
    row: Optional[Row] = None
    broken: bool = False
    """The group can no longer be trusted (a collective failed part-way): the worker must be replaced."""
    seconds: dict[str, float] = field(default_factory=dict)

    def brief(self) -> dict[str, Any]:
        return {"rank": self.rank, "status": self.status, "message": self.message, "error_kind": self.error_kind,
                "broken": self.broken}


class _Stop(Exception):
    """A step ended the case on every rank: (status, message, kind) agreed."""

    def __init__(self, status: str, message: Optional[str], kind: Optional[ErrorKind]):
        super().__init__(message or status)
        self.status, self.message, self.kind = status, message, kind


def _kind(err: BaseException) -> ErrorKind:
    kind: ErrorKind = classify_message(f"{type(err).__name__}: {err}")
    return kind


def _said(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).strip()[:500]}"


def _agree(group: RankGroup, status: str, message: Optional[str] = None, kind: Optional[ErrorKind] = None) -> None:
    """Every rank's outcome of this step; _Stop with the first rank's (by rank) that is not ok, named."""
    everyone = group.gather_objects((status, message, kind))
    for r, (s, m, k) in enumerate(everyone):
        if s != "ok":
            raise _Stop(s, f"rank {r} of {group.world}: {m}", k)


GRAPH_REFUSAL = ("--timing graph is not built for multi-rank cases: each timed iteration waits in a device "
                 "barrier between calls, which a replay of captured calls would leave out; time them with "
                 "--timing kernels (the default) or events")


def _refusal(case: Case, backend: Any, name: str, device: str, cpu_max_gflop: float, cpu_max_gb: float,
             world: int, timing_mode: str = "kernels") -> Optional[str]:
    why = case_refusal(case, ranks=world)
    if why is not None:
        return why
    if timing_mode == "graph" and device == "cuda":
        return GRAPH_REFUSAL
    if backend is None:
        return f"backend {name!r} has no {case.type} op"
    if not isinstance(backend, RankedBackend):
        return (f"backend {name!r} has no multi-rank {case.type} (the torch backend has gemm tp, moe tp, tp·ep, "
                "dp·ep, collective)")
    if device == "cpu" and case.flops() > cpu_max_gflop * 1e9:
        return (f"CPU device: {case.flops() / 1e9:.0f} GFLOP per call exceeds cpu_max_gflop={cpu_max_gflop:g} "
                "(a CPU would take minutes a call)")
    if device == "cpu" and case.min_bytes() > cpu_max_gb * 1e9:
        return (f"CPU device: {case.min_bytes() / 1e9:.1f} GB moved per call exceeds cpu_max_gb={cpu_max_gb:g}")
    return backend.supports_ranks(case, device, world)


def _clock(runner: CaseRunner, group: RankGroup) -> IterationClock:
    """CUDA: kernel spans from the activity records (as single-rank rows), or event pairs under
    `--timing events`; the CPU: the host clock."""
    if runner.device.kind == "cuda":
        make = CudaIterationClock if _events_timed(runner) else KernelIterationClock
        return make(group.barrier, runner.timer.flusher.flush, runner.telemetry.max_sm_clock_hz())
    return HostIterationClock(group.barrier)


def _events_timed(runner: CaseRunner) -> bool:
    return runner.config.timing.mode == "events"


def _recording_paused(runner: CaseRunner) -> AbstractContextManager[None]:
    """CUDA under `--timing events`: CUPTI's recording off while the ranks are timed (event pairs must not
    pay its per-call cost, and records nobody reads would pile up); otherwise nothing to pause."""
    if runner.device.kind != "cuda" or not _events_timed(runner):
        return nullcontext()
    from operatorx.measure.activity import activity_paused

    return activity_paused()


def _scaled_peak(peak: Optional[Peak], world: int) -> Optional[Peak]:
    """The peaks of `world` devices together (the row's rates are the whole group's)."""
    if peak is None:
        return None

    def times(v: Optional[float]) -> Optional[float]:
        return None if v is None else v * world

    return Peak(compute_class=peak.compute_class, tflops=times(peak.tflops), memory_gbps=times(peak.memory_gbps),
                measured_tflops=times(peak.measured_tflops), measured_memory_gbps=times(peak.measured_memory_gbps),
                source=f"{peak.source} × {world} ranks" if peak.source else f"× {world} ranks")


def _kernel_times(device: str, m: RankMeasurement) -> str:
    if device == "cpu":
        return NO_KERNELS_CPU
    return KERNELS_RECORDED if m.busy_us is not None else NO_KERNELS_EVENTS


class _RankCase:
    """The steps of one rank's case; `parts` collects rank 0's row parts as they become known."""

    def __init__(self, runner: CaseRunner, case: Case, index: int, assignment: RankAssignment):
        self.runner, self.case, self.index, self.a = runner, case, index, assignment
        self.device = runner.device.kind
        self.parts: dict[str, Any] = {}
        self.seconds: dict[str, float] = {}
        self.held: list[RankPrepared] = []

    def run(self, group: RankGroup, fault: Optional[RankFault]) -> None:
        """Raises _Stop (agreed) or anything a broken collective raised; returns when the case was timed."""
        config, case = self.runner.config, self.case
        backend = get_backend(config.backend, case.type)
        why = _refusal(case, backend, config.backend, self.device, config.cpu_max_gflop, config.cpu_max_gb,
                       self.a.world, config.timing.mode)
        _agree(group, "unsupported" if why else "ok", why)
        assert isinstance(backend, RankedBackend)
        t0 = time.perf_counter()
        self._prepare(backend, group)
        check = self._check(group)
        self.seconds["prepare_check"] = time.perf_counter() - t0
        prepared = self.held[0]
        t0 = time.perf_counter()
        fn = fault.wrap(prepared.prepared.fn) if fault is not None else prepared.prepared.fn
        try:
            if fault is not None:
                fault.timing_begins()
            with _recording_paused(self.runner):
                done = measure_ranks_with_retries(fn, _clock(self.runner, group), group, self.runner.telemetry,
                                                  config.timing, first_op=not getattr(loop, "_process_warmed", False),
                                                  before_barrier=fault.before_barrier() if fault is not None else None)
            status, message, kind = "ok", None, None
        except Exception as err:  # noqa: BLE001 - every rank learns of it below (or times out, if it cannot)
            done, status, message, kind = None, "error", _said(err), _kind(err)
            self.parts["traceback"] = traceback.format_exc(limit=6)
        self.seconds["timing"] = time.perf_counter() - t0
        _agree(group, status, message, kind)
        assert done is not None
        self._row_parts(group, prepared, check, done)

    def _prepare(self, backend: RankedBackend, group: RankGroup) -> None:
        status, message, kind = "ok", None, None
        try:
            self.held.append(backend.prepare_ranks(self.case, self.device, group))
        except Unsupported as err:
            status, message = "unsupported", err.reason
        except Exception as err:  # noqa: BLE001 - a library's refusal is unsupported; anything else an error
            refusal = library_refusal(err)
            if refusal is not None:
                status, message = "unsupported", f"library refused: {refusal}"
            else:
                status, message, kind = "error", _said(err), _kind(err)
                self.parts["traceback"] = traceback.format_exc(limit=6)
        _agree(group, status, message, kind)
        self.parts["extra"] = json_safe(self.held[0].prepared.metadata)

    def _check(self, group: RankGroup) -> Check:
        try:
            check = self.held[0].prepared.check()
            status, message, kind = "ok", None, None
        except Exception as err:  # noqa: BLE001
            check, status, message, kind = None, "error", _said(err), _kind(err)
            self.parts["traceback"] = traceback.format_exc(limit=6)
        _agree(group, status, message, kind)
        assert check is not None
        self.parts["check"] = CheckResult.model_validate(json_safe(check.to_json()))
        if not check.ok:                     # the same Check on every rank: all stop here
            raise _Stop("error", f"wrong result: relative error {check.rel_error:.3g} > bound {check.bound:.3g} "
                                 f"({check.reference})", "check")
        return check

    def _row_parts(self, group: RankGroup, prepared: RankPrepared, check: Check, done: RankAttempts) -> None:
        m, a = done.measurement, self.a
        mine = {"rank": a.rank, "gpu": a.gpus[a.rank], "worker": a.workers[a.rank],
                "latency_us": m.rank_latency_us(a.rank), "busy_us": m.busy_median_us(),
                "collective_us": m.collective_median_us(), "capped": bool(done.telemetry.get("capped")),
                "telemetry": json_safe(done.telemetry)}
        lines = group.gather_objects(mine)
        if a.rank != 0:
            return
        config, kind = self.runner.config, self.device
        summary = m.summary()
        l2 = "n/a (cpu)" if kind == "cpu" else config.timing.l2_state
        slowest_busy_us = max((line["busy_us"] for line in lines if line["busy_us"] is not None), default=None)
        self.parts["measured"] = Measured(
            latency_us=m.latency_us, busy_us=slowest_busy_us, method=m.method, clock=m.clock,  # type: ignore[arg-type]
            l2_state=l2, l2_verified=self.runner.l2_check.get("verified") if self.runner.l2_check else None,
            noise=json_safe(summary.get("median_noise")), summary_us=Summary.model_validate(json_safe(summary)),
            samples_us=list(m.iterations.max_us), warmup=Warmup(calls=m.warmup_calls, seconds=m.warmup_s),
            stop_reason=m.stop_reason,
            timing=TimingInfo.model_validate(json_safe({**config.timing_used(kind), "l2_state": l2,
                                                        "window_start_s": m.window_start_s,
                                                        **({"pause_s": m.pause_s} if m.pause_s else {})})))
        peak = _peak(self.case, self.runner.peaks)
        self.parts["rates"] = case_rates(self.case, prepared.flops, prepared.min_bytes, m.latency_us,
                                         _scaled_peak(peak, a.world))
        self.parts["conditions"] = Conditions(
            telemetry=Telemetry.model_validate(json_safe({**done.telemetry, "attempts": done.attempts})),
            capped=bool(done.capped_ranks))
        self.parts["ranks"] = Ranks(
            world=a.world, split=a.split, latency_us_min=m.latency_us_min, skew_us=m.skew_us,
            iterations=len(m.iterations.max_us), starved_iterations_dropped=m.starved_dropped,
            host_gaps_included=m.host_gaps_included, starved_iterations_kept=m.starved_kept,
            capped_ranks=done.capped_ranks, barrier=m.barrier,
            kernel_times=_kernel_times(kind, m), collectives=prepared.collectives,
            per_rank=[RankLine(rank=line["rank"], gpu=line["gpu"], worker=line["worker"],
                               latency_us=line["latency_us"], samples_us=m.by_rank_us[line["rank"]],
                               busy_us=line["busy_us"], collective_us=line["collective_us"],
                               capped=line["capped"],
                               telemetry=Telemetry.model_validate(line["telemetry"]) if kind == "cuda" else None)
                      for line in lines],
            placement_group=a.placement_group)

    def release(self) -> Optional[str]:
        try:
            for held in self.held:
                if held.prepared.release is not None:
                    held.prepared.release()
        except Exception as err:  # noqa: BLE001
            return f"release failed: {_said(err)[:300]}"
        finally:
            self.held.clear()
            self.runner._free()
        return None


def run_rank_case(runner: CaseRunner, case: Case, index: int, assignment: RankAssignment) -> RankResult:
    """This rank's part of the case; rank 0's result holds the case's row. Nothing raised here
    escapes: a failure is this rank's result (and, on rank 0, the row's `error`)."""
    t_case, started_unix_s = time.perf_counter(), time.time()
    rank = assignment.rank
    step = _RankCase(runner, case, index, assignment)
    status, message, kind, broken = "ok", None, None, False
    try:
        fault = rank_fault(rank)
        group, _ = ensure_group(assignment, runner.device.kind)
        step.run(group, fault)
    except _Stop as stop:
        status, message, kind = stop.status, stop.message, stop.kind
    except Exception as err:  # noqa: BLE001 - a collective that failed part-way: the group is broken
        status, message, kind, broken = "error", f"rank {rank} of {assignment.world}: {_said(err)}", _kind(err), True
        step.parts.setdefault("traceback", traceback.format_exc(limit=6))
    cleanup = step.release()
    if cleanup is not None:
        message = f"{message}; rank {rank}: {cleanup}" if message else f"rank {rank}: {cleanup}"
        if status == "ok":
            status, kind = "error", "exception"
    result = RankResult(rank=rank, status=status, message=message, error_kind=kind, broken=broken,
                        seconds=step.seconds)
    if rank != 0:
        return result
    if status == "unsupported":                  # an unsupported row carries no measurement
        for name in ("measured", "rates", "conditions", "ranks"):
            step.parts.pop(name, None)
    if status == "error":
        kind = kind or "exception"
    seconds = CaseSeconds(**step.seconds, total=time.perf_counter() - t_case, started_unix_s=started_unix_s)
    config = runner.config
    result.row = Row(case=case, backend=config.backend, status=status, testlist=runner.testlist,  # type: ignore[arg-type]
                     case_index=index, message=message, error_kind=kind if status == "error" else None,
                     scheme=case.scheme(), case_seconds=seconds, worker=runner._worker(), **step.parts)
    return result
