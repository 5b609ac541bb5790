"""One case end to end: support check → prepare → correctness check → timing → a Row.

Whatever happens, the case ends as a Row (`ok`, `unsupported` or `error`); only the case in
flight can be lost.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from operatorx.backends import Backend, Check, Prepared, Unsupported, get_backend
from operatorx.backends.refusal import library_refusal
from operatorx.measure import Measurement, NotMeasurable
from operatorx.measure import Telemetry as TelemetryReader
from operatorx.measure.loop import GiveUp
from operatorx.measure.placed import measure_placed
from operatorx.measure.record import TimerRecord
from operatorx.platform import DeviceInfo, Peaks, compute_class
from operatorx.result import (
    CaseSeconds,
    CheckResult,
    Conditions,
    ErrorKind,
    HostTime,
    Measured,
    Peak,
    Placement,
    Rates,
    Row,
    Summary,
    Telemetry,
    TimingInfo,
    Warmup,
    WhatRan,
    WorkerDevice,
    compute_rates,
    json_safe,
)
from operatorx.run.case_gate import case_refusal, gate_case
from operatorx.run.config import RunConfig
from operatorx.run.faults import classify_message
from operatorx.run.placements import Placements, add_placements
from operatorx.spec import Case

__all__ = ["CaseRunner", "Timer", "prepare_and_check", "case_rates"]


#: On the CPU device, cases that must move more than this many GB a call are `unsupported`: a few GB of
#: weights and little arithmetic take tens of seconds a call there, and would end as a timeout.
CPU_MAX_GB = 4.0


def prepare_and_check(backend: Optional[Backend], backend_name: str, case: Case, device: str,
                      cpu_max_gflop: float, held: list[Prepared],
                      cpu_max_gb: float = CPU_MAX_GB) -> tuple[str, Optional[str], Optional[Check]]:
    """Everything before timing, the same for `run` and `ab`: (status, message, check).

    The prepared case is appended to `held` as soon as it exists, so the caller releases it
    whatever happens next. A library's own "no kernel for that" while preparing is `unsupported`.
    """
    why_not = case_refusal(case)
    if why_not is not None:
        return "unsupported", why_not, None
    if backend is None:
        return "unsupported", f"backend {backend_name!r} has no {case.type} op", None
    if device == "cpu" and case.flops() > cpu_max_gflop * 1e9:
        return "unsupported", (f"CPU device: {case.flops() / 1e9:.0f} GFLOP per call exceeds cpu_max_gflop="
                               f"{cpu_max_gflop:g} (a CPU would take minutes a call)"), None
    if device == "cpu" and case.min_bytes() > cpu_max_gb * 1e9:
        return "unsupported", (f"CPU device: {case.min_bytes() / 1e9:.1f} GB moved per call exceeds cpu_max_gb="
                               f"{cpu_max_gb:g} (weights this large take tens of seconds a call on a CPU)"), None
    reason = backend.supports(case, device)
    if reason is not None:
        return "unsupported", reason, None
    try:
        held.append(backend.prepare(case, device))
    except Unsupported as err:
        return "unsupported", err.reason, None
    except Exception as err:  # noqa: BLE001 - a refusal is unsupported; anything else propagates as error
        refusal = library_refusal(err)
        if refusal is None:
            raise
        return "unsupported", f"library refused: {refusal}", None
    check = held[-1].check()
    if not check.ok:
        return ("error", f"wrong result: relative error {check.rel_error:.3g} > bound {check.bound:.3g} "
                f"({check.reference})", check)
    return "ok", None, check


class Timer(Protocol):
    method: str
    flusher: Any

    def measure(self, fn: Any, pause_s: float = 0.0,
                give_up: Optional[GiveUp] = None) -> Measurement[TimerRecord]: ...


def _check(check: Check) -> CheckResult:
    return CheckResult.model_validate(json_safe(check.to_json()))


def _peak(case: Case, peaks: Optional[Peaks]) -> Optional[Peak]:
    """The peaks that apply to the case's compute class (None without a peak table, and for a collective,
    whose bound is the interconnect: OpArgs.bus_traffic)."""
    if peaks is None or case.args.bus_traffic() is not None:
        return None
    # the datasheet peaks, the GPU's measured ones beside (platform/calibrate.py)
    return peaks.part(compute_class(*case.args.peak_dtypes()))


def case_rates(case: Case, flops: int, min_bytes: int, time_us: float, peak: Optional[Peak]) -> Rates:
    """The row's rates (`compute_rates`), with a collective's NCCL-tests size and bus factor."""
    bus = case.args.bus_traffic()
    if bus is None:
        return compute_rates(flops, min_bytes, time_us, peak, cost_parts=case.args.cost_parts())
    return compute_rates(flops, min_bytes, time_us, peak, bus.size_bytes, bus.bus_factor)


def _error_kind(err: BaseException) -> ErrorKind:
    """What kind of failure an exception in the case is, by the sweep's rules (run/faults.py: only
    sticky CUDA errors are `cuda_fault`); the sweep itself adds timeout, crashed and leak."""
    kind: ErrorKind = classify_message(f"{type(err).__name__}: {err}")
    return kind


@dataclass
class CaseRunner:
    config: RunConfig
    device: DeviceInfo
    timer: Timer
    telemetry: TelemetryReader
    peaks: Optional[Peaks]
    testlist: str
    l2_check: Optional[dict[str, Any]] = None
    run_id: Optional[str] = None
    launch_gap_us: Optional[float] = None
    """This process's launch-gap level (measure/launch_gap.py), carried by every row it times."""
    _seconds: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    """Wall seconds of this case's phases (prepare_check, timing, profile), reset per case."""

    def run(self, case: Case, index: int) -> Row:
        """The case's row. Nothing raised by a backend (prepare, check, timing, release) escapes:
        it becomes this row's `error`, and the run goes on to the next case."""
        held: list[Prepared] = []
        self._seconds = {}
        t_case, started_unix_s = time.perf_counter(), time.time()
        error_kind: Optional[ErrorKind] = None
        try:
            status, message, parts = self._attempt(case, held, index)
            if status == "error":
                error_kind = "check"
        except Exception as err:  # noqa: BLE001 - any failure becomes this case's error row
            status, message = "error", f"{type(err).__name__}: {str(err).strip()[:500]}"
            error_kind = _error_kind(err)
            parts = {"traceback": traceback.format_exc(limit=6)}
        cleanup = self._release(held)
        if cleanup is not None:
            status = "error"
            error_kind = error_kind or "exception"
            message = f"{message}; {cleanup}" if message else cleanup
        seconds = CaseSeconds(**self._seconds, total=time.perf_counter() - t_case, started_unix_s=started_unix_s)
        return Row(case=case, backend=self.config.backend, status=status, testlist=self.testlist,  # type: ignore[arg-type]
                   case_index=index, message=message, error_kind=error_kind, scheme=case.scheme(),
                   case_seconds=seconds, worker=self._worker(), **parts)

    def _worker(self) -> WorkerDevice:
        """The device this process measures on (uuid and bus id where DeviceInfo knows them)."""
        d = self.device
        return WorkerDevice(kind=d.kind, name=d.name, uuid=getattr(d, "uuid", None),
                            pci_bus_id=getattr(d, "pci_bus_id", None), index=getattr(d, "index", None))

    def _attempt(self, case: Case, held: list[Prepared], index: int) -> tuple[str, Optional[str], dict[str, Any]]:
        """(status, message, the row's typed parts by field); the prepared case goes into `held` as
        soon as it exists."""
        gate = gate_case(case, self.config.rank_local)
        if gate.timed is None:
            return "unsupported", gate.reason, {}
        shard = {"rank_local": gate.rank_local} if gate.rank_local is not None else {}
        case = gate.timed                   # the case itself, or the one rank's shard the row says it is
        backend = get_backend(self.config.backend, case.type)
        t0 = time.perf_counter()
        status, message, check = prepare_and_check(backend, self.config.backend, case, self.device.kind,
                                                   self.config.cpu_max_gflop, held, self.config.cpu_max_gb)
        self._seconds["prepare_check"] = time.perf_counter() - t0
        if status != "ok" or check is None:
            parts = {"check": _check(check), "extra": json_safe(held[0].metadata)} if check is not None else {}
            return status, message, {**parts, **shard}
        prepared = held[0]
        placements = None
        if self.config.placements > 1:
            t0 = time.perf_counter()
            placements = add_placements(backend, case, self.device.kind, prepared,  # type: ignore[arg-type]
                                        self.config.placements, held)
            self._seconds["prepare_check"] += time.perf_counter() - t0
        try:
            parts = self._measure(case, prepared, index, placements)
        except NotMeasurable as err:
            return "unsupported", err.reason, {"check": _check(check), "extra": json_safe(prepared.metadata), **shard}
        parts.update(shard)
        parts["check"] = _check(check)
        if self.config.host:
            from operatorx.measure.activity import activity_paused
            from operatorx.run.host import host_metrics

            measured: Measured = parts["measured"]
            with activity_paused():     # host time without CUPTI's per-call tracing cost
                host = host_metrics(prepared, self.device.kind, self.config.host_timing,
                                    measured.latency_us if measured.clock == "device" else None)
            parts["host"] = HostTime.model_validate(json_safe(host))
        return "ok", None, parts

    def _release(self, held: list[Prepared]) -> Optional[str]:
        """Release the case's memory and state; a failure here is reported, never raised."""
        try:
            for prepared in held:
                if prepared.release is not None:
                    prepared.release()
        except Exception as err:  # noqa: BLE001
            return f"release failed: {type(err).__name__}: {str(err).strip()[:300]}"
        finally:
            self._free()
        return None

    def _measure(self, case: Case, prepared: Prepared, index: int,
                 placements: Optional[Placements] = None) -> dict[str, Any]:
        """The row's measured, rates, conditions and ran parts (by field name), and its backend metadata;
        with placements, the median over them and each one's number."""
        t0 = time.perf_counter()
        fns = placements.fns() if placements is not None else [prepared.fn]
        placed = measure_placed(self.timer, fns, self.telemetry, self.config.timing)
        if placements is not None:
            placements.drop_pads()
        done = placed.attempted
        m, telemetry, attempts = done.measurement, done.telemetry, done.attempts
        self._seconds["timing"] = time.perf_counter() - t0
        record = m.details
        seen = record.stored()
        seen.pop("busy_samples_us", None)          # the row keeps them beside samples_us, not in timing
        measured = Measured(
            latency_us=m.latency_us,
            busy_us=record.busy_us_median,
            **({"busy_samples_us": record.busy_samples_us} if record.busy_samples_us is not None else {}),
            method=m.method,
            clock=m.clock,  # type: ignore[arg-type]
            l2_state=record.l2_state,
            l2_verified=self.l2_check.get("verified") if self.l2_check else None,
            noise=json_safe(m.summary.get("median_noise")),
            summary_us=Summary.model_validate(json_safe(m.summary)),
            samples_us=m.samples_us,
            warmup=Warmup(calls=m.warmup_calls, seconds=m.warmup_s),
            stop_reason=m.stop_reason,
            timing=TimingInfo.model_validate(json_safe({**self.config.timing_used(self.device.kind), **seen,
                                                        **({"launch_gap_us": self.launch_gap_us}
                                                           if self.launch_gap_us is not None else {})})),
        )
        nbytes = prepared.min_bytes if prepared.min_bytes is not None else case.min_bytes()
        parts: dict[str, Any] = {
            "measured": measured,
            "rates": case_rates(case, case.flops(), nbytes, m.latency_us, _peak(case, self.peaks)),
            "conditions": Conditions(telemetry=Telemetry.model_validate(json_safe({**telemetry, "attempts": attempts})),
                                     capped=telemetry["capped"]),
            "extra": json_safe(dict(prepared.metadata)),
        }
        if placements is not None:
            parts["placement"] = Placement(count=len(fns), requested=placements.requested,
                                           per_placement_us=placed.per_placement_us,
                                           per_placement_busy_us=placed.per_placement_busy_us,
                                           spread_pct=placed.spread_pct, pad_bytes=placements.pad_bytes,
                                           rounds=placed.rounds, fewer_why=placements.fewer_why)
        if self.device.kind == "cuda":
            t0 = time.perf_counter()
            try:
                ran = self._profile(prepared, m, index)
            except Exception as err:  # noqa: BLE001 - the timing stands; what failed after it is said beside it
                ran = {"profile_error": f"{type(err).__name__}: {str(err).strip()[:300]}"}
            parts["ran"] = WhatRan.model_validate(json_safe(ran))
            self._seconds["profile"] = time.perf_counter() - t0
        return parts

    def _profile(self, prepared: Prepared, m: Measurement[TimerRecord], index: int) -> dict[str, Any]:
        """The per-kernel breakdown, the `--trace` file, and the `--counters` replay (CUDA only)."""
        from operatorx.measure.kernels import export_trace, kernel_breakdown

        out: dict[str, Any] = {}
        batch = m.last_batch
        if batch is None and (self.config.profile_kernels or self.config.trace_dir is not None):
            from operatorx.measure.trace import trace_batch  # events mode: one untimed profiled batch

            batch = trace_batch(prepared.fn, 8, self.timer.flusher.flush, 0)
        if batch is not None and self.config.profile_kernels:
            from operatorx.measure.trace import trace_batch

            # CUPTI's kernel records carry grid/block/registers; Kineto's come from a trace export, of a
            # 2-call batch when the timed one is large (the 8-call batch of events mode exports itself)
            small = batch if batch is not m.last_batch or batch.profiler is None else \
                trace_batch(prepared.fn, 2, self.timer.flusher.flush, 0)
            out["profile"] = kernel_breakdown(batch, shapes_from=small)
        if batch is not None and self.config.trace_dir is not None:
            path = export_trace(batch, self.config.trace_dir / f"{self.run_id or 'run'}-case{index:05d}.json")
            out["trace_path"] = str(path)
        if self.config.counters_child:
            import torch

            from operatorx.measure.ncu import PERTURBED_REASON, counters_replay_range

            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push(counters_replay_range(index))
            try:
                prepared.fn()
                torch.cuda.synchronize()
            finally:
                torch.cuda.nvtx.range_pop()
            out["perturbed"] = PERTURBED_REASON
        return out

    def _free(self) -> None:
        if self.device.kind == "cuda":
            import torch

            try:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            except RuntimeError:  # a device fault surfaces here; the case's row already says error
                pass
