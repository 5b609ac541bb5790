"""A/B: two implementations of each case in one process, on the same inputs, batch by batch.

Why one process and alternating batches: two separate runs differ in clocks, thermal state,
allocator and import state by more than the few µs an A/B is usually about. Here, for each case:
1. both sides prepare (each under its own settings) and run their own check;
2. their outputs are compared once (bitwise, within tolerance, or different) — a speed
   difference between two different results is reported next to that fact, never alone;
3. host time: batches of A and B alternate (A,B then B,A ...), measure/host_time.py;
4. device time (CUDA): rounds of batches timed by the run's device timer (kernel-level by
   default, with its L2 flush and spin), alternating the same way; one median per side per round;
5. per clock, the paired median difference (Hodges–Lehmann) with its interval and a verdict, which
   a number that includes contended batches, or the placement spread, holds back (run/ab_stats.py).
Inputs are the same when both sides build them from the case seed (the torch backend does;
user code does with `gemm_inputs`); the output comparison shows whether they did.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from operatorx.backends import Prepared
from operatorx.measure.activity import activity_paused
from operatorx.measure.host_time import HostTimeSettings, HostTiming
from operatorx.measure.settings import TimingSettings
from operatorx.run.ab_placement import ab_placements
from operatorx.run.ab_spec import Side
from operatorx.run.ab_stats import paired_difference
from operatorx.run.case import prepare_and_check
from operatorx.run.compare import compare_outputs
from operatorx.run.placements import add_placements
from operatorx.spec import Case
from operatorx.uncontrolled import cpu_contention

__all__ = ["ABSettings", "ABResult", "run_ab_case"]


@dataclass(frozen=True, kw_only=True)
class ABSettings:
    host: HostTimeSettings = field(default_factory=HostTimeSettings)
    device_rounds: int = 15
    """CUDA only: alternating rounds of timed batches; one median per side per round."""
    device_round_calls: int = 32
    timing: TimingSettings = field(default_factory=TimingSettings)
    """The device timer (mode, L2 state, spin) and warmup for device time."""
    confidence: float = 0.95
    same_within_rel: float = 0.01
    """A difference below this fraction of A's time gets the verdict `same` even when resolved."""
    cpu_max_gflop: float = 50.0
    """On the CPU device, larger cases are unsupported (as in `run`)."""
    placements: int = 3
    """CUDA: copies of each side at other device addresses (run/placements.py); the device rounds
    cycle over them, and a difference within their spread is never called faster or slower."""

    def __post_init__(self) -> None:
        if not 1 <= self.placements <= 8:
            raise ValueError(f"ab: --placements must be 1..8, got {self.placements}")
        if self.device_rounds < 6 or self.device_round_calls < 1:
            raise ValueError("ab: device_rounds must be >= 6 (fewer pairs cannot reach a 95% verdict) "
                             "and device_round_calls >= 1")
        if not 0 < self.confidence < 1 or self.same_within_rel < 0:
            raise ValueError("ab: confidence in (0, 1), same_within_rel >= 0")


@dataclass
class ABResult:
    case: Case
    status: str                                  # "ok", "unsupported" or "error"
    message: Optional[str] = None
    sides: dict[str, Any] = field(default_factory=dict)      # per side: spec, check, metadata, reason
    outputs: Optional[dict[str, Any]] = None
    host: Optional[dict[str, Any]] = None
    device: Optional[dict[str, Any]] = None

    def to_json(self) -> dict[str, Any]:
        return {"case": self.case.to_json(), "label": self.case.label(), "status": self.status,
                "message": self.message, "sides": self.sides, "outputs": self.outputs,
                "host": self.host, "device": self.device}


def _prepare(side: Side, case: Case, device: str, settings: ABSettings,
             held: list[Prepared]) -> tuple[Optional[Prepared], dict[str, Any]]:
    """One side up to timing, by the same steps as `run` (run/case.py: prepare_and_check)."""
    info: dict[str, Any] = {"spec": side.spec}
    mine: list[Prepared] = []
    try:
        with side.context():
            status, message, check = prepare_and_check(side.backend(case.type), side.base, case, device,
                                                       settings.cpu_max_gflop, mine)
    finally:
        held.extend(mine)                       # released by the caller, whatever happened here
    if check is not None:
        info["check"] = check.to_json()
        info["metadata"] = dict(mine[0].metadata)
    if status != "ok":
        info["unsupported" if status == "unsupported" else "error"] = message
        return None, info
    return mine[0], info


def _device_rounds(fns: dict[str, list[Callable[[], Any]]], sides: dict[str, Side], settings: ABSettings,
                   device: str) -> tuple[dict[str, list[float]], str]:
    """CUDA: per round, one timed batch per side (the run's timer) in alternating order; the batch
    medians, and the timer's method (what the rows say was used). Round i times each side's
    placement i mod N (run/placements.py), so every pair is taken at one placement per side and the
    pairs cycle over them."""
    from dataclasses import replace

    import torch

    from operatorx.measure.device_timer import device_timer
    from operatorx.measure.loop import warmup
    from operatorx.measure.telemetry import Telemetry
    from operatorx.platform import describe_device

    info, telemetry = describe_device(device), Telemetry.for_torch_device(0)
    n = settings.device_round_calls
    round_settings = replace(settings.timing, warmup_calls=1, warmup_floor_s=0.0, first_warmup_floor_s=0.0,
                             min_samples=n, max_samples=n, batch_size=n, noise_target=0.0, max_time_s=1e9,
                             throttle_retries=0, rested_call_s=0.0)   # each round alike: no rest decided per round
    timer = device_timer(round_settings, info.l2_bytes, telemetry.max_sm_clock_hz())
    for name, copies in fns.items():
        with sides[name].context():
            for fn in copies:
                warmup(fn, torch.cuda.synchronize, settings.timing)
    names = list(fns)
    medians: dict[str, list[float]] = {name: [] for name in names}
    for i in range(settings.device_rounds):
        for name in (names if i % 2 == 0 else names[::-1]):
            with sides[name].context():
                copies = fns[name]
                medians[name].append(timer.measure(copies[i % len(copies)]).latency_us)
    return medians, str(timer.method)


def run_ab_case(case: Case, a: Side, b: Side, device: str, settings: ABSettings) -> ABResult:
    """One case through both sides; every failure ends as this case's result, never the run's."""
    sides = {"a": a, "b": b}
    result = ABResult(case=case, status="ok")
    prepared: dict[str, Prepared] = {}
    held: list[Prepared] = []
    try:
        for name, side in sides.items():
            p, info = _prepare(side, case, device, settings, held)
            result.sides[name] = info
            if p is not None:
                prepared[name] = p
        problems = [f"{n}: {i[k]}" for n, i in result.sides.items() for k in ("unsupported", "error") if k in i]
        if problems:
            result.status = "error" if any("error" in i for i in result.sides.values()) else "unsupported"
            result.message = "; ".join(problems)
            return result
        fns = {name: p.fn for name, p in prepared.items()}
        outs = {}
        for name, fn in fns.items():
            with sides[name].context():
                outs[name] = fn()
        result.outputs = compare_outputs(outs["b"], outs["a"])
        del outs
        around = {name: side.context for name, side in sides.items()}
        with activity_paused():         # host time without CUPTI's per-call tracing cost
            host = HostTiming(settings.host, device).measure_interleaved(fns, around=around)
        contended = [n for n, m in host.items() if m.details.cpu_contended]
        # Paired and interleaved, the two sides share the load, and a contended round is dropped whole:
        # only a number that kept contended batches (no clean round was left) is held back.
        kept = [n.upper() for n, m in host.items() if m.details.contended_batches_kept > 0]
        contention = [cpu_contention(kept, "the number includes batches that waited for a CPU")] if kept else []
        diff = paired_difference(host["a"].samples_us, host["b"].samples_us, settings.confidence,
                                 settings.same_within_rel, contention)
        result.host = {**diff.to_json(), "batch_us_per_call": {n: m.samples_us for n, m in host.items()},
                       "iqr_us": {n: m.summary["iqr"] for n, m in host.items()},
                       "batch_calls": host["a"].details.batch_calls,
                       "rounds_dropped": host["a"].details.rounds_dropped,
                       "warnings": {n: m.details.warnings for n, m in host.items() if m.details.warnings},
                       "gpu_paced": {n: m.details.gpu_paced for n, m in host.items()},
                       "cpu_contended": {n: n in contended for n in host}}
        if device == "cuda":
            copies = {name: [fn] for name, fn in fns.items()}
            fewer: dict[str, str] = {}
            if settings.placements > 1:
                for name, side in sides.items():
                    with side.context():
                        placed = add_placements(side.backend(case.type), case, device,  # type: ignore[arg-type]
                                                prepared[name], settings.placements, held)
                    copies[name] = placed.fns()
                    if placed.fewer_why:
                        fewer[name] = placed.fewer_why
            rounds, method = _device_rounds(copies, sides, settings, device)
            spread = ab_placements(rounds, {name: len(c) for name, c in copies.items()}, settings.placements, fewer)
            dd = paired_difference(rounds["a"], rounds["b"], settings.confidence, settings.same_within_rel,
                                   spread.conditions())
            result.device = {**dd.to_json(), "round_median_us": rounds,
                             "round_calls": settings.device_round_calls, "method": method,
                             "l2_state": settings.timing.l2_state, "placement": spread.to_json()}
        else:
            result.device = None
            result.sides["note"] = "CPU device: no separate device clock; host time is the whole call"
    except Exception as err:  # noqa: BLE001 - the case's result says what failed
        result.status = "error"
        result.message = f"{type(err).__name__}: {str(err).strip()[:500]}"
        result.sides["traceback"] = traceback.format_exc(limit=6)
    finally:
        for p in held:
            try:
                if p.release is not None:
                    p.release()
            except Exception as err:  # noqa: BLE001 - a failed release is this case's error, not the run's
                result.status = "error"
                result.message = f"{result.message + '; ' if result.message else ''}release failed: {err}"
    return result
