"""What a worker does with a case: time it (`run`) or compare two sides on it (`ab`).

A job is built once per worker process from a `JobSpec` (plain data that crosses process
boundaries as JSON), then asked for one row per case. The same job runs in a spawned worker
(`local`), inside a Ray actor's worker (`ray`) and in the calling process (`inline`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Protocol

from operatorx.backends.names import entry_for
from operatorx.run.config import RunConfig

if TYPE_CHECKING:
    from operatorx.result import Row
    from operatorx.run.ranks.assignment import RankAssignment
    from operatorx.run.ranks.rank_runner import RankResult
    from operatorx.spec import Case

__all__ = ["JobSpec", "ABJob", "Job", "build_job"]


@dataclass(frozen=True)
class ABJob:
    """The two sides of an A/B (parsed in each worker) and its settings as JSON."""

    a: str
    b: str
    settings: dict[str, Any]


@dataclass(frozen=True)
class JobSpec:
    config: RunConfig
    run_id: str
    testlist: str
    """The testlist's name as the user gave it (stored on every row)."""
    ab: Optional[ABJob] = None

    @property
    def backend_label(self) -> str:
        """The `backend` of every row: the backend spec, or `ab: A | B`."""
        return self.config.backend if self.ab is None else f"ab: {self.ab.a} | {self.ab.b}"

    def to_json(self) -> dict[str, Any]:
        """The record kept with the run (documents, the store): the database's password hidden."""
        return self._json(self.config.to_json())

    def worker_json(self) -> dict[str, Any]:
        """What a worker process (or Ray actor) is sent: no database at all (RunConfig.worker_json)."""
        return self._json(self.config.worker_json())

    def _json(self, config: dict[str, Any]) -> dict[str, Any]:
        return {"config": config, "run_id": self.run_id, "testlist": self.testlist,
                "ab": None if self.ab is None else {"a": self.ab.a, "b": self.ab.b, "settings": self.ab.settings}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobSpec:
        ab = data.get("ab")
        return cls(config=RunConfig.from_json(data["config"]), run_id=data["run_id"], testlist=data["testlist"],
                   ab=None if ab is None else ABJob(a=ab["a"], b=ab["b"], settings=ab["settings"]))


class Job(Protocol):
    info: dict[str, Any]
    """Where this job runs: device, software, the L2 probe (stored with the run)."""

    def run(self, case: Case, index: int) -> Row: ...


class _RunJob:
    """A run's worker: the device described, the timer built, then one row per case.

    The start is ordered so that the host's own work overlaps the GPU's: CUPTI's start (1 s when it
    ran after torch's import) runs on a thread from the first line, beside torch's import and CUDA's
    start; the clock ramp then queues a second of spin, and while the GPU spins the host turns
    recording on, imports SciPy and reads the software stack; then come the steps that wait on the
    GPU: the backend's warmup (the first cuBLAS call loads kernels, which waits for the spin), the
    timer (Triton's first launch waits the same way), the flush buffer's graph capture, the L2
    probe, the launch-gap probe (the process's level, which every row carries: measure/launch_gap.py).
    Built the other way round, the flusher waited out the spin and CUPTI started after it: about a
    second more per worker."""

    def __init__(self, spec: JobSpec, device_kind: str) -> None:
        from operatorx.measure import HostClockTiming, Telemetry
        from operatorx.platform import describe_device
        from operatorx.run.case import CaseRunner
        from operatorx.run.metadata import run_info

        config = spec.config
        startup = _Stopwatch()
        cuda = device_kind == "cuda"
        cupti = cuda and config.timing.mode != "events"
        if cupti and config.trace_dir is None:
            from operatorx.measure.activity import open_in_background

            open_in_background()            # CUPTI's start on a thread, beside torch's import and CUDA's
            startup.lap("activity_thread")
        device = describe_device(device_kind)
        startup.lap("device")
        peaks, peaks_info = None, None
        if cuda:     # before the timer: no profiler sees the calibration's kernels
            from operatorx.platform.calibrate import device_peaks

            peaks, peaks_info = device_peaks(device, recalibrate=config.recalibrate, run_id=spec.run_id,
                                             measure_now=not config.counters_child)   # ncu would perturb it
            startup.lap("peaks")
        telemetry = Telemetry.for_torch_device(0) if cuda else Telemetry(None)
        ramp: Any = None
        if cuda:
            from operatorx.measure.clock_ramp import start_clock_ramp

            ramp = start_clock_ramp(config.timing.first_warmup_floor_s, telemetry.max_sm_clock_hz())
            if config.trace_dir is not None:
                from operatorx.measure.activity import use_kineto

                use_kineto("--trace: the trace files are Kineto's export")
            if cupti:
                from operatorx.measure.activity import activity_session

                session = activity_session()    # (its thread's end, or its whole start), while the GPU spins
                startup.lap("activity")
                for step, seconds in (getattr(session, "startup_s", None) or {}).items():
                    startup.laps[f"activity.{step}"] = seconds    # inside the lap above, by step
        # host-only steps, also while the GPU spins
        from operatorx.measure.stats import preload

        preload()                           # SciPy's import: the worker's, not its first case's
        startup.lap("stats")
        info = run_info(device)
        startup.lap("run_info")
        backend_warmup = _warm_backend(config.backend, device_kind)
        startup.lap("backend")
        # the steps that wait for the GPU (the first of them for the rest of the spin)
        l2_check = None
        ramp_info = None
        launch_gap: dict[str, Any] = {}
        if cuda:
            from operatorx.measure.device_timer import device_timer

            timer: Any = device_timer(config.timing, device.l2_bytes, telemetry.max_sm_clock_hz())
            startup.lap("timer")
            if cupti:
                from operatorx.measure.kernel_timing import warm_activity_session

                warm_activity_session()     # the session's first batch, outside any case's time cap
                if config.timing.spin:
                    from operatorx.measure.host_release import host_release

                    host_release()          # the batches' released wait: its kernel compiled now
                startup.lap("first_batch")
            if config.check_l2:
                from operatorx.measure.l2_check import check_l2_states

                l2_check = check_l2_states(device.l2_bytes, config.timing.l2_state, telemetry.max_sm_clock_hz())
                startup.lap("l2_check")
            if cupti and config.timing.mode == "kernels":    # (a graph replays without launch gaps)
                launch_gap = _launch_gap(timer.sm_clock_hz, config.timing.spin)   # (2 GHz where NVML gave none)
                startup.lap("launch_gap")
        else:
            timer = HostClockTiming(config.timing)
        self.runner = CaseRunner(config=config, device=device, timer=timer, telemetry=telemetry, l2_check=l2_check,
                                 run_id=spec.run_id, peaks=peaks, testlist=spec.testlist,
                                 launch_gap_us=launch_gap.get("gap_us"))
        if ramp is not None:
            # read last: a backend's import (vLLM's: seconds of host work) would let the clock fall
            # again after an earlier reading, and the first case would skip its long warmup on a stale one
            ramp_info = ramp.finish(telemetry, config.timing.capped_clock_fraction)
            startup.lap("clock_ramp")
        self.info = {**info, "l2_check": l2_check, "device_kind": device_kind, "peaks": peaks_info,
                     "backend_warmup": backend_warmup, "startup_s": startup.laps, "clock_ramp": ramp_info,
                     "launch_gap": launch_gap or None}

    def run(self, case: Case, index: int) -> Row:
        return self.runner.run(case, index)

    def run_rank(self, case: Case, index: int, assignment: RankAssignment) -> RankResult:
        """This worker's rank of a multi-rank case (run/ranks/rank_runner.py)."""
        from operatorx.run.ranks.rank_runner import run_rank_case

        return run_rank_case(self.runner, case, index, assignment)


class _Stopwatch:
    """Seconds of each step of a worker's start (the job's info `startup_s`): a sweep pays them once
    per worker before its first case, and on many GPUs they bound the speed-up."""

    def __init__(self) -> None:
        self._t = time.perf_counter()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self._t, 4)
        self._t = now


def _launch_gap(sm_clock_hz: float, released: bool) -> dict[str, Any]:
    """The process's launch-gap level (measure/launch_gap.py) for the job's info and every row: `gap_us`,
    `kernel_us`, `boundaries`; or `error` where the probe failed (the worker goes on without it)."""
    from dataclasses import asdict

    from operatorx.measure.launch_gap import measure_launch_gap

    try:
        gap = measure_launch_gap(sm_clock_hz, released)
    except Exception as err:  # noqa: BLE001 - a condition not read is said, never the worker's end
        first = (str(err).strip().splitlines() or [""])[0]
        return {"error": f"{type(err).__name__}: {first[:200]}"}
    if gap is None:
        return {"error": "no probe call counted (no kernel recorded, or the host late for every call)"}
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(gap).items()}


def _warm_backend(backend: str, device_kind: str) -> Optional[str]:
    """Import the backend's framework (vLLM's process state, the user's module, cuBLAS for torch)
    before the first case: its one-time cost in host memory (about 1 GiB for vLLM) and time then
    belongs to the worker, not to whichever case happens to come first, and the memory check sees
    only what cases keep.
    Returns why warming failed (the cases will say it again, each as its own row)."""
    try:
        entry = entry_for(backend)
        if entry is not None:
            entry.warm_up(device_kind)
    except Exception as err:  # noqa: BLE001 - not the worker's failure: each case reports its own
        return f"{type(err).__name__}: {str(err).strip()[:300]}"
    return None


class _ABJob:
    def __init__(self, spec: JobSpec, device_kind: str) -> None:
        from operatorx.measure import HostTimeSettings, TimingSettings
        from operatorx.platform import describe_device
        from operatorx.run.ab import ABSettings
        from operatorx.run.ab_spec import parse_side
        from operatorx.run.metadata import run_info

        assert spec.ab is not None
        raw = dict(spec.ab.settings)
        self.settings = ABSettings(host=HostTimeSettings(**raw.pop("host", {})),
                                   timing=TimingSettings(**raw.pop("timing", {})), **raw)
        self.a, self.b = parse_side(spec.ab.a), parse_side(spec.ab.b)
        self.spec, self.device_kind = spec, device_kind
        device = describe_device(device_kind)
        l2_check = None
        if device_kind == "cuda" and spec.config.check_l2:      # the same probe a run makes
            from operatorx.measure.l2_check import check_l2_states
            from operatorx.measure.telemetry import Telemetry

            l2_check = check_l2_states(device.l2_bytes, self.settings.timing.l2_state,
                                       Telemetry.for_torch_device(0).max_sm_clock_hz())
        self.info = {**run_info(device), "device_kind": device_kind, "l2_check": l2_check}

    def run(self, case: Case, index: int) -> Row:
        from operatorx.result import Row
        from operatorx.run.ab import run_ab_case
        from operatorx.run.faults import classify_message

        result = run_ab_case(case, self.a, self.b, self.device_kind, self.settings).to_json()
        message = result.get("message")
        # an error row has its kind from the start, by the rule the worker applies to a row without one
        kind = classify_message(message, wrong_result=(message or "").startswith("wrong result")) \
            if result["status"] == "error" else None
        return Row.model_validate({"case": case, "backend": self.spec.backend_label, "status": result["status"],
                                   "testlist": self.spec.testlist, "case_index": index, "error_kind": kind,
                                   "message": message, "metrics": {"ab": result}})


def build_job(spec: JobSpec, cpu_share: Optional[int] = None) -> Job:
    """The job for this process. `cpu_share`: torch threads for a CPU worker, so N workers on one
    host split its cores instead of each taking them all."""
    device_kind = spec.config.device or "cpu"
    if device_kind == "cpu" and cpu_share:
        import torch

        torch.set_num_threads(max(1, cpu_share))
        os.environ["OMP_NUM_THREADS"] = str(max(1, cpu_share))
    return _ABJob(spec, device_kind) if spec.ab is not None else _RunJob(spec, device_kind)
