"""The typed parts of a row (operatorx.result.Row): what was measured, rates, conditions, what ran,
the check, host time, memory. Each field's description and unit feed docs/metrics.md.

Every field name is its key in the result document's flat `metrics` object.
"""

from __future__ import annotations

import math
from typing import Any, Literal, Optional

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

__all__ = ["Part", "OpenPart", "ClosedPart", "DOCUMENT", "loading_document", "Measured", "Summary", "Warmup",
           "bound_by", "TimingInfo", "Rates", "Peak", "Conditions", "Telemetry", "WhatRan", "KernelProfile", "Kernel",
           "CheckResult", "HostTime", "CaseSeconds",
           "WorkerDevice", "MemoryCheck", "Placement", "compute_rates", "json_safe", "doc"]


def doc(description: str, unit: str = "", default: Any = None) -> Any:
    """A field with its meaning and unit (both go into docs/metrics.md)."""
    return Field(default, description=description, json_schema_extra={"unit": unit})


def json_safe(value: Any) -> Any:
    """`value` as plain JSON data: a non-JSON object (a torch dtype in backend metadata) becomes its
    text, a tuple key its text, NaN or infinity None (unknown: strict JSON stores refuse them)."""
    if isinstance(value, BaseModel):
        return value
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


class Part(BaseModel):
    """A typed part of a row. Only the keys that were given are written back (exact round trip)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True, by_alias=True)


class OpenPart(Part):
    """A part whose full content belongs to the code that measures it (measure/): the keys named here
    are typed; others are kept as they came."""

    model_config = ConfigDict(frozen=True, extra="allow", allow_inf_nan=False)


DOCUMENT: dict[str, Any] = {"document": True}
"""Validation context of a stored document (`Row.from_json`): what an earlier version wrote loads as
it was written (ClosedPart's older keys; Row's status rules)."""


def loading_document(info: ValidationInfo) -> bool:
    """Whether this validation reads a stored document rather than building a new row."""
    return isinstance(info.context, dict) and bool(info.context.get("document"))


class ClosedPart(Part):
    """A part that takes only the keys declared here from the code that fills it (`extra="forbid"`: a
    key added without its meaning fails where it is made), but that loads a stored document's keys
    this version no longer declares: they are kept as they came and written back, so old documents
    load and round-trip exactly."""

    _older: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_older_keys(cls, data: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        if not (isinstance(data, dict) and loading_document(info)):
            return handler(data)
        older = {k: v for k, v in data.items() if k not in cls.model_fields}
        if not older:
            return handler(data)
        part = handler({k: v for k, v in data.items() if k not in older})
        part._older = older
        return part

    @model_serializer(mode="wrap")
    def _with_older_keys(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        return {**out, **self._older} if self._older else out

    @property
    def older_keys(self) -> dict[str, Any]:
        """Keys a stored document carried that this version does not declare (empty for a new part)."""
        return dict(self._older)


# --- the number and how it was taken --------------------------------------------------------------

class Summary(OpenPart):
    median: Optional[float] = doc("median of the kept samples", "µs")
    mean: Optional[float] = doc("mean", "µs")
    min: Optional[float] = doc("fastest sample", "µs")
    max: Optional[float] = doc("slowest sample", "µs")
    p10: Optional[float] = doc("10th percentile", "µs")
    p90: Optional[float] = doc("90th percentile", "µs")
    iqr: Optional[float] = doc("interquartile range", "µs")
    std: Optional[float] = doc("standard deviation (n-1)", "µs")
    n: Optional[int] = doc("samples kept", "calls")
    cv: Optional[float] = doc("std / mean", "fraction")
    median_noise: Optional[float] = doc("relative 95% confidence half-width of the median; null when too few "
                                        "samples to know", "fraction")

    @field_validator("median_noise", "cv", mode="before")
    @classmethod
    def _unknown_if_not_finite(cls, v: Any) -> Any:
        return v if not isinstance(v, float) or math.isfinite(v) else None


class Warmup(Part):
    calls: Optional[int] = doc("untimed calls before timing", "calls")
    seconds: Optional[float] = doc("wall time of the warmup", "s")


class TimingPhases(Part):
    """Seconds of one timing attempt, by phase (kernels and graph modes)."""

    warmup_s: Optional[float] = doc("warmup calls, each synchronized", "s")
    batches_s: Optional[float] = doc("the timed batches, wall time (host loop, synchronize, reading the records)",
                                     "s")
    spin_gpu_s: Optional[float] = doc("GPU time of the spins and waits ahead of the batches (the host enqueues "
                                      "meanwhile; a released wait counted as the host's enqueue time)", "s")
    loop_s: Optional[float] = doc("the whole sampling loop, wall time", "s")


class TimingInfo(ClosedPart):
    """The timing settings used (measure/settings.py) plus what the timer saw (measure/record.py)."""

    mode: Optional[str] = doc("`kernels`, `events` or `graph` (settings); `host_clock` on the CPU device")
    noise_target: Optional[float] = doc("the stopping rule's target for `noise` (settings)", "fraction")
    warmup_calls: Optional[int] = doc("settings: calls before timing, at least", "calls")
    warmup_floor_s: Optional[float] = doc("settings: warm up for at least this long", "s")
    first_warmup_floor_s: Optional[float] = doc("settings: the warmup floor of a process's first op (an idle GPU "
                                                "reaching its clocks)", "s")
    min_samples: Optional[int] = doc("settings: the median is taken over at least this many calls", "calls")
    max_samples: Optional[int] = doc("settings: stop after this many timed calls", "calls")
    max_time_s: Optional[float] = doc("settings: sampling wall-time cap once `min_samples` are in (stop reason "
                                      "`time_cap`)", "s")
    timeout_s: Optional[float] = doc("settings: hard sampling limit even below `min_samples` (stop reason "
                                     "`timeout`)", "s")
    batch_size: Optional[int] = doc("settings: timed calls enqueued behind one GPU wait", "calls")
    spin: Optional[bool] = doc("settings: a GPU wait queued ahead of each batch so the host stays ahead "
                               "(false on the CPU device)")
    throttle_retries: Optional[int] = doc("settings: attempts taken again when the GPU was capped", "count")
    throttle_pause_s: Optional[float] = doc("settings: retry k pauses 2^(k-1) times this (or the call, when longer) "
                                            "between calls", "s")
    unpaused_retry_below_s: Optional[float] = doc("settings: retries of a call shorter than this do not pause "
                                                  "between calls", "s")
    rested_call_s: Optional[float] = doc("settings: a call at least this long is timed rested from its first "
                                         "attempt (0: off)", "s")
    throttle_cooldown_s: Optional[float] = doc("settings: retry k first rests the GPU 2^(k-1) times this", "s")
    capped_clock_fraction: Optional[float] = doc("settings: an attempt is capped when a power/thermal reason is "
                                                 "active and the SM clock is under this fraction of its maximum",
                                                 "fraction")
    telemetry_period_s: Optional[float] = doc("settings: NVML sampling period during the timed window", "s")
    l2_state: Optional[str] = doc("the L2 state the timer produced before each call (`Measured.l2_state`); "
                                  "`n/a (cpu)` on the CPU device")
    flush_launch: Optional[str] = doc("how the L2 flush was launched: `cuda_graph` (one replay) or `eager`")
    graph: Optional[bool] = doc("the op was captured in a CUDA graph and its replays timed (`graph` mode)")
    pause_s: Optional[float] = doc("the pause after each timed call the kept attempt made (a retry's, or a long "
                                   "call's rest from its first attempt)", "s")
    window_start_s: Optional[float] = doc("the worker's `time.perf_counter()` when the timed window began "
                                          "(the telemetry summary starts there)", "s")
    spins: Optional[int] = doc("`events` mode: GPU spins queued ahead of calls", "count")
    spin_short_batches: Optional[int] = doc("batches whose GPU wait ran out before the host had enqueued them "
                                            "(the next wait was sized up)", "batches")
    starved_gap_us: Optional[float] = doc("a call one of whose kernels started more than this after everything "
                                          "launched earlier had ended waited on the host: starved", "µs")
    batches: Optional[int] = doc("timed batches (each behind one GPU spin; its activity records read after it)",
                                 "count")
    activity_source: Optional[str] = doc("where the kernel records came from: `cupti-python` (one CUPTI session "
                                         "kept open by the worker) or `kineto` (one torch.profiler session per "
                                         "batch: without cupti-python, or with `--trace`)")
    activity_fallback: Optional[str] = doc("why this process recorded with Kineto, when it did")
    activity_api_calls: Optional[str] = doc("which CUDA API calls CUPTI recorded: `launches` (only those that put "
                                            "work on the GPU, the default) or `all` (`OPERATORX_CUPTI_API=all`, or "
                                            "a CUPTI before 12.6 that cannot filter)")
    activity_api_ids_refused: Optional[int] = doc("API calls (of those that launch nothing) CUPTI would not "
                                                  "filter because it does not know them: recorded anyway", "count")
    phases: Optional[TimingPhases] = doc("where the kept attempt's seconds went")
    activity_records_dropped: Optional[int] = doc("device records CUPTI delivered incomplete or undecodable: a "
                                                  "call may have lost a kernel from its span", "count")
    activity_forced_flushes: Optional[int] = doc("batches whose records were taken with CUPTI's forced flush: "
                                                 "the quick flush after the batch's synchronize left a launch and "
                                                 "its device records unpaired, or a call with fewer device records "
                                                 "than the batch's others; or CUPTI records every API call. Each "
                                                 "costs the next launch ~0.2 ms, nothing else",
                                                 "batches")
    starved_calls_dropped: Optional[int] = doc("calls the host left waiting (their span would count host time): "
                                               "dropped", "calls")
    starved_calls_kept: Optional[int] = doc("starved calls kept because the op itself waits on the host "
                                            "(`host_gaps_included`)", "calls")
    late_launch_calls_kept: Optional[int] = doc("kept calls with a launch that returned on the host less than 5 µs "
                                                "before the GPU was free for it (the host only just ahead; "
                                                "measure/trace.py): recorded, not dropped", "calls")
    host_gaps_included: Optional[bool] = doc("the op leaves the GPU idle inside every call: gaps are in its span")
    queue_max_calls: Optional[int] = doc("the cap on calls per batch that the last batch set: what fits in 80% of "
                                         "the GPU's launch queue (about 1,024 launches) at the launches one [flush, "
                                         "call] made; none when rested (each call is its own queue)", "calls")
    queue_overflow_batches: Optional[int] = doc("batches that held more calls than that cap (normally only the "
                                                "first, before the launches per call are known): the host may have "
                                                "blocked in a launch, so neither their enqueue time nor their "
                                                "starved calls resized the next spin", "batches")
    unattributed_activities: Optional[int] = doc("device activities no timed call launched", "count")
    spin_released_batches: Optional[int] = doc(
        "batches queued behind a wait that the host ends right after its last launch (measure/host_release.py): "
        "those whose spin is not trimmed (the first batch, every batch of a multi-kernel call or with Kineto's "
        "records, the batch after a starved one); the others spin a length sized from the last batch. The wait "
        "still ends by its budget (the untrimmed spin's length) if the host has not let go by then, e.g. when it "
        "blocked in a full launch queue; the GPU time counted for it is the shorter of the two",
        "batches")
    spin_release_unavailable: Optional[str] = doc("why this process spun fixed lengths instead of waiting for "
                                                  "the host (no Triton, or pinned memory the GPU cannot map); "
                                                  "null when the wait works or was never asked for (`--no-spin`)")
    flush_bytes: Optional[int] = doc("size of the L2 flush buffer", "bytes")
    enqueue_us_per_call: Optional[float] = doc("host time to enqueue one [flush, call] with the activity "
                                               "records on (it sizes the spin ahead of each batch)", "µs")
    busy_us_median: Optional[float] = doc("median time some kernel of the call ran (also `busy_us`)", "µs")
    gap_before_call_us_median: Optional[float] = doc("median idle GPU time before each call", "µs")
    launch_gap_us: Optional[float] = doc(
        "the worker's launch-gap level: idle GPU time between two dependent kernels of one stream, read once "
        "at the worker's start (measure/launch_gap.py; `kernels` mode). A process keeps one level for its "
        "life and processes can differ, with or without a profiler: a multi-kernel call's span carries it at "
        "each kernel boundary, its busy time does not. "
        "`results compare` flags a case whose two rows differ in it",
        "µs")
    contention_signal: Optional[str] = doc(
        "host clock (CPU device): how a sample that lost the CPU is told (measure/cpu_contention.py): "
        "`schedstat_run_delay` (Linux: time the calling thread, and threads that worked on the call, sat runnable "
        "on a run queue, not running; blocking is not counted) or `process_cpu_time` (fallback: wall time the "
        "process's threads together did not use a CPU)")
    contended_samples_dropped: Optional[int] = doc(
        "host clock: samples whose run-queue wait exceeded 5% of their wall time (another process had the "
        "CPU): dropped, like starved GPU calls", "samples")
    contended_samples_kept: Optional[int] = doc(
        "host clock: contended samples kept because fewer than `min_samples` were clean (none, or a few): the "
        "number is then from all samples, `cpu_contended` is true and the number includes waiting for a CPU",
        "samples")
    cpu_wait_fraction: Optional[float] = doc(
        "host clock: run-queue wait (fallback: time off the CPU) over the wall time of all timed samples, "
        "dropped ones included; above 1 when several of the call's threads waited at once", "fraction")
    cpu_contended: Optional[bool] = doc(
        "host clock: more than half the samples lost the CPU, or the number is from contended samples: a busy "
        "machine; read `cpu_contended_why` before trusting `latency_us`")
    cpu_contended_why: Optional[str] = doc("host clock: what `cpu_contended` means for this row's number, in words")


class Measured(Part):
    """The headline number, its samples, and how they were taken."""

    latency_us: float = doc(
        "median span of one call: first kernel's start to last kernel's end (host wall time on the CPU "
        "device, `clock` says which). The headline by default: what a caller waits for", "µs", ...)
    busy_us: Optional[float] = doc(
        "median time some kernel of the call was running (the union of its kernels' intervals): what "
        "Nsight Compute's sum of kernels compares with. Null where the timer cannot tell (events, CPU)", "µs")
    busy_samples_us: Optional[list[float]] = doc("busy time of each kept call, where the timer gives it", "µs")
    method: Optional[str] = doc("`cupti_kernels` (default on CUDA), `cupti_kernels/cuda_graph`, `cuda_events`, "
                      "`host_clock/perf_counter`", "")
    clock: Optional[Literal["device", "host"]] = doc("`device` (GPU timestamps) or `host` (CPU wall clock)", "")
    l2_state: Optional[str] = doc("the L2 state each timed call started in: `cold_clean`, `cold_dirty`, `warm`")
    l2_verified: Optional[bool] = doc("whether the run's start-up probe confirmed that L2 state (`run.l2_check` "
                                      "in the document has the probe times); null when not probed")
    noise: Optional[float] = doc("relative 95% confidence half-width of the median (distribution-free); null "
                                 "when too few samples to know", "fraction")
    summary_us: Optional[Summary] = doc("statistics of `samples_us`", "µs")
    samples_us: list[float] = doc("every kept sample (the span of each call); starved calls, and on the host clock "
                                  "calls that lost the CPU, are dropped and counted in `timing`", "µs")
    warmup: Optional[Warmup] = doc("calls and seconds before timing")
    stop_reason: Optional[str] = doc("`noise_target`, `time_cap`, `max_samples`, `timeout` (`batches` for host "
                                     "time); `capped`: an attempt cut short because the GPU was capped, kept only "
                                     "when its retry failed")
    timing: Optional[TimingInfo] = doc("the settings used, plus what the timer saw")

    @property
    def gaps_us(self) -> Optional[float]:
        """GPU idle time inside the median call (span − busy): launch gaps between its kernels."""
        return None if self.busy_us is None else max(0.0, self.latency_us - self.busy_us)


# --- rates ---------------------------------------------------------------------------------------

class Peak(Part):
    compute_class: Optional[str] = doc("`bf16`, `fp16`, `fp8`, `fp32`: which compute peak applies")
    tflops: Optional[float] = doc("datasheet compute peak of that class; null when the device has none", "TFLOP/s")
    memory_gbps: Optional[float] = doc("datasheet memory bandwidth peak", "GB/s")
    measured_tflops: Optional[float] = doc("this GPU's own compute peak of that class: the best of a few large "
                                           "`torch.matmul` (bf16) or `torch._scaled_mm` (fp8) GEMMs, measured "
                                           "once per GPU, driver, torch and CUDA version (docs/peaks.md); `pct_peak` "
                                           "is taken against it where present", "TFLOP/s")
    measured_memory_gbps: Optional[float] = doc("this GPU's own memory bandwidth: a large device-to-device copy, "
                                                "bytes read + written / time, measured with `measured_tflops`; "
                                                "`pct_peak` is taken against it where present", "GB/s")
    source: Optional[str] = doc("where the peaks `pct_peak` used come from: `vendor datasheet, dense`, or "
                                "`measured <date> ...` with the datasheet beside", "")


class Rates(Part):
    """Work and rates from the case's own counts and `latency_us` (`compute_rates`)."""

    flops: Optional[int] = doc("floating-point operations of one call (2·m·n·k for a GEMM; a collective's "
                               "reduction adds, (W-1)·elements for all_reduce and reduce_scatter)", "FLOP")
    min_bytes: Optional[int] = doc("bytes one call must move at least (operands once, output once; an MoE counts the "
                                   "experts its routing hit; a collective: the bytes all ranks together send plus "
                                   "receive, W · 2 · bus_factor · collective_bytes)", "bytes")
    tflops: Optional[float] = doc("flops / latency_us / 1e6", "TFLOP/s")
    gbps: Optional[float] = doc("min_bytes / latency_us / 1e3", "GB/s")
    pct_peak: Optional[float] = doc("the larger of tflops / peak TFLOP/s and gbps / peak GB/s, × 100, against the "
                                    "GPU's measured peaks where the row has them (`peak.measured_tflops`, "
                                    "`peak.measured_memory_gbps`), else the datasheet's: how close to its bound the "
                                    "call ran; none for a collective (its bound is the interconnect, which the peaks "
                                    "table does not hold)", "%")
    pct_datasheet: Optional[float] = doc("`pct_peak` against the datasheet peaks alone; written only where measured "
                                         "peaks set `pct_peak` (compare it with rows that have none)", "%")
    peak: Optional[Peak] = doc("the peaks `pct_peak` is taken against")
    cost_parts: Optional[dict[str, int]] = doc("an attention call's `flops` and `min_bytes` by part "
                                               "(`projection_flops`, `attention_flops`, `projection_bytes`, "
                                               "`cache_bytes`, `state_bytes`: spec/attention_cost.py)", "FLOP, bytes")
    bound_by: Optional[str] = doc("the part of `cost_parts` whose time at the peaks (FLOPs at peak TFLOP/s, bytes "
                                  "at peak GB/s, the measured peaks where the row has them) is the longest: what "
                                  "bounds the call", "")
    collective_bytes: Optional[int] = doc("a collective's size as NCCL-tests counts it: `elements` × the dtype's bytes "
                                          "(all_reduce: each rank's buffer; all_gather: the gathered output; "
                                          "reduce_scatter: each rank's whole input; all_to_all: each rank's send "
                                          "buffer); absent for other ops", "bytes")
    bus_factor: Optional[float] = doc("a collective's busbw / algbw, as NCCL-tests defines it: all_reduce 2(W-1)/W; "
                                      "all_gather, reduce_scatter, all_to_all (W-1)/W", "")
    algbw_gbps: Optional[float] = doc("a collective's algorithm bandwidth: collective_bytes / latency_us / 1e3 "
                                      "(NCCL-tests' algbw)", "GB/s")
    busbw_gbps: Optional[float] = doc("a collective's bus bandwidth: algbw_gbps × bus_factor (NCCL-tests' busbw): "
                                      "what each rank sent (and received) per second at the optimal algorithm, "
                                      "comparable across world sizes with a link's bandwidth", "GB/s")


def _pct(tflops: float, gbps: float, peak_tflops: Optional[float], peak_gbps: Optional[float]) -> Optional[float]:
    fractions = [gbps / peak_gbps] if peak_gbps else []
    if peak_tflops:
        fractions.append(tflops / peak_tflops)
    return 100.0 * max(fractions) if fractions else None


def bound_by(parts: dict[str, int], peak_tflops: Optional[float], peak_gbps: Optional[float]) -> Optional[str]:
    """The part whose time at the peaks is the longest (`*_flops` parts at peak_tflops, the others at
    peak_gbps); None without both peaks."""
    if not peak_tflops or not peak_gbps:
        return None
    seconds = {name: n / (peak_tflops * 1e12 if name.endswith("_flops") else peak_gbps * 1e9)
               for name, n in parts.items()}
    return max(seconds, key=lambda name: seconds[name])


def compute_rates(flops: int, min_bytes: int, time_us: float, peak: Optional[Peak],
                  collective_bytes: Optional[int] = None, bus_factor: Optional[float] = None,
                  cost_parts: Optional[dict[str, int]] = None) -> Rates:
    """The one place rates are computed: FLOP/time and bytes/time, `pct_peak` against `peak` (its
    measured peaks where it has them, else its datasheet ones; then `pct_datasheet` too); for a
    collective (its NCCL-tests size and bus factor given) algbw and busbw as NCCL-tests computes them;
    for an op with `cost_parts` the parts and the one that bounds the call at the peaks."""
    if not time_us > 0:
        raise ValueError(f"rates need a positive time, got {time_us!r} µs")
    rates = _rates(flops, min_bytes, time_us, peak, collective_bytes, bus_factor)
    if cost_parts is None:
        return rates
    p_tflops = None if peak is None else peak.measured_tflops or peak.tflops
    p_gbps = None if peak is None else peak.measured_memory_gbps or peak.memory_gbps
    extra: dict[str, Any] = {"cost_parts": dict(cost_parts)}
    bound = bound_by(cost_parts, p_tflops, p_gbps)
    if bound is not None:
        extra["bound_by"] = bound
    return Rates(**rates.model_dump(exclude_unset=True), **extra)


def _rates(flops: int, min_bytes: int, time_us: float, peak: Optional[Peak], collective_bytes: Optional[int],
           bus_factor: Optional[float]) -> Rates:
    tflops = flops / time_us / 1e6
    gbps = min_bytes / time_us / 1e3
    bus: dict[str, Any] = {}
    if collective_bytes is not None and bus_factor is not None:
        algbw = collective_bytes / time_us / 1e3
        bus = {"collective_bytes": collective_bytes, "bus_factor": bus_factor, "algbw_gbps": algbw,
               "busbw_gbps": algbw * bus_factor}
    if peak is None:
        return Rates(flops=flops, min_bytes=min_bytes, tflops=tflops, gbps=gbps, **bus)
    pct_peak = _pct(tflops, gbps, peak.measured_tflops or peak.tflops, peak.measured_memory_gbps or peak.memory_gbps)
    if peak.measured_tflops is None and peak.measured_memory_gbps is None:
        return Rates(flops=flops, min_bytes=min_bytes, tflops=tflops, gbps=gbps, pct_peak=pct_peak, peak=peak, **bus)
    return Rates(flops=flops, min_bytes=min_bytes, tflops=tflops, gbps=gbps, pct_peak=pct_peak,
                 pct_datasheet=_pct(tflops, gbps, peak.tflops, peak.memory_gbps), peak=peak, **bus)


# --- conditions -----------------------------------------------------------------------------------

class Telemetry(OpenPart):
    """NVML (or amdsmi) readings inside the kept attempt's timed window (measure/telemetry.py)."""

    available: Optional[bool] = doc("whether the GPU could be read at all")
    capped: Optional[bool] = doc("at least a tenth of the timed window's readings showed a power/thermal reason "
                                 "with the SM clock under the capped fraction, or no reason bit at all with the "
                                 "clock under 90% of the highest this worker has read (`clock_low_no_reason`, "
                                 "NVML only) (`capped_readings` counts them)")
    capping_reasons: Optional[list[str]] = doc("the reasons seen, by name (`clock_low_no_reason`: a low clock that "
                                               "none of NVML's reasons explains)")
    readings: Optional[int] = doc("readings inside the timed window", "count")
    capped_readings: Optional[int] = doc("readings that showed the cap (reason and lower clock, or a ramping "
                                         "clock)", "count")
    sm_clock_mhz: Optional[dict[str, Any]] = doc("SM clock `min`/`p50`/`max`", "MHz")
    mem_clock_mhz: Optional[dict[str, Any]] = doc("memory clock `min`/`p50`/`max`", "MHz")
    power_w: Optional[dict[str, Any]] = doc("board power `min`/`p50`/`max`", "W")
    temperature_c: Optional[dict[str, Any]] = doc("GPU temperature `min`/`p50`/`max`", "°C")
    energy_mj: Optional[float] = doc("energy the GPU used between the attempt's first and last telemetry "
                                     "readings (`energy_s` long)", "mJ")
    energy_s: Optional[float] = doc("how long the `energy_mj` interval was", "s")
    attempts: Optional[list[dict[str, Any]]] = doc("every attempt in brief (`latency_us`, `pause_s`, `capped`, "
                                                   "`converged`, `kept`): a capped attempt is retried after a "
                                                   "50/100/200 ms rest, pausing between calls 0.5/1/2 ms or 1/2/4 "
                                                   "times the call when longer (no pause for a call under 50 µs); "
                                                   "a call of 1 ms or more pauses as long as itself from the first "
                                                   "attempt, doubling at each retry; until one is uncapped or two "
                                                   "paused attempts agree (`converged`); an attempt with a retry "
                                                   "after it stops as soon as it shows the cap (`stop_reason: "
                                                   "capped`)")


class Conditions(Part):
    telemetry: Optional[Telemetry] = doc("the GPU's clocks, power and temperature while it was timed")
    capped: Optional[bool] = doc("the kept attempt ran under a power or thermal cap (a tenth of its readings or "
                                 "more: SM clock < 98.5% of max with such a reason), or with the clock low for no "
                                 "reason NVML names (< 90% of the highest read): its number describes the cap")


# --- what ran -------------------------------------------------------------------------------------

class Kernel(OpenPart):
    name: Optional[str] = doc("kernel name", "")
    count_per_call: Optional[float] = doc("launches per call", "count")
    device_us_per_call: Optional[float] = doc("this kernel's device time per call", "µs")
    device_us_median: Optional[float] = doc("median duration of one launch", "µs")


class KernelProfile(OpenPart):
    calls: Optional[int] = doc("calls the breakdown is taken over", "calls")
    span_us_median: Optional[float] = doc("median span of those calls", "µs")
    busy_us_median: Optional[float] = doc("median busy time of those calls", "µs")
    kernels: list[Kernel] = doc("per kernel: name, launches, device time, launch shape (grid, block, "
                                "registers, shared memory)", "", [])

    @property
    def kernels_per_call(self) -> float:
        return sum(k.count_per_call or 0.0 for k in self.kernels)


class WhatRan(Part):
    profile: Optional[KernelProfile] = doc("which kernels one call runs, from the timed CUPTI records")
    trace_path: Optional[str] = doc("the Perfetto-readable trace written with `--trace`")
    counters: Optional[dict[str, Any]] = doc("with `--counters`: ncu's `duration_us`, `sm_throughput_pct`, "
                                             "`dram_throughput_pct`, `achieved_occupancy_pct`, per-kernel list, "
                                             "tool and its cache/clock control")
    perturbed: Optional[str] = doc("set on every row of a `--counters` run: its latencies were taken under ncu")
    profile_error: Optional[str] = doc("the profile, trace or ncu replay failed after timing; the timing stands")


# --- the rest of a row ----------------------------------------------------------------------------

class CheckResult(Part):
    """The correctness check against an fp32 reference, once before timing."""

    checked: Optional[bool] = doc("false when nothing was compared (user code without a reference)")
    ok: Optional[bool] = doc("rel_error <= bound; null when not checked")
    rel_error: Optional[float] = doc("‖out − ref‖_F / ‖ref‖_F over the rows checked", "fraction")
    bound: Optional[float] = doc("the largest rel_error this case's dtypes allow", "fraction")
    rows_checked: Optional[int] = doc("output rows compared", "rows")
    reference: Optional[str] = doc("what the reference computed, in words")


class HostTime(ClosedPart):
    """With `--host`: what the Python call costs on the CPU (measure/host_time.py)."""

    host_us_per_call: Optional[float] = doc("median over batches of batch wall time / calls", "µs")
    iqr_us: Optional[float] = doc("spread of the batch values", "µs")
    batch_us_per_call: Optional[list[float]] = doc("each batch's value", "µs")
    summary_us: Optional[Summary] = doc("statistics of `batch_us_per_call`", "µs")
    method: Optional[str] = doc("`host_time/alternating_batches`")
    settings: Optional[dict[str, Any]] = doc("the host-time settings used (`batches`, `batch_calls`, "
                                             "`warmup_batches`, `order`, `preempt_retries`, `max_wall_s`)")
    batch_calls: Optional[int] = doc("calls per batch used (fewer than the settings' when a slow call would "
                                     "not fit `max_wall_s`; `warnings` says so)", "calls")
    device_us_per_call: Optional[float] = doc("the device latency it is compared with", "µs")
    host_bound: Optional[bool] = doc("the GPU waits for Python: the batches' middle half all above the device time "
                                     "(false: all below it, or the GPU still behind the host after the batches; "
                                     "null: neither, `host_bound_why` says)")
    host_bound_why: Optional[str] = doc("why `host_bound` is null: no separate device time (CPU device), or the "
                                        "device time inside the batches' middle half (neither side is the bound)")
    spread_pct: Optional[float] = doc("batch IQR / host_us_per_call × 100", "%")
    stable: Optional[bool] = doc("`spread_pct` at most 5%: the host time repeats well enough to compare")
    unstable_why: Optional[str] = doc("why the batches disagree, when not `stable`: CPU contention, the GPU pacing "
                                      "the host, or host and GPU about as long")
    gpu_paced: Optional[bool] = doc("the GPU was still behind the host at the end of each batch: the host time "
                                    "may include launch-queue back-pressure")
    drain_us_median: Optional[float] = doc("median wall time of the synchronize closing each batch (not counted)",
                                           "µs")
    warnings: Optional[list[str]] = doc("what may inflate the host time (function modes, launch queue, a "
                                        "busy CPU)")
    contention_signal: Optional[str] = doc(
        "how a batch that lost the CPU is told (measure/cpu_contention.py): `schedstat_run_delay` (Linux: time "
        "the calling thread sat runnable on a run queue; waiting on the GPU or a lock is blocking, not counted) "
        "or `thread_cpu_time` (fallback: wall time the thread did not use a CPU)")
    contended_batches_dropped: Optional[int] = doc(
        "batches whose run-queue wait exceeded 5% of their wall time: taken again (`preempt_retries`) or left "
        "out with their round, so the public call's and layers' batches stay paired", "batches")
    contended_batches_kept: Optional[int] = doc(
        "contended batches in the number because no round was clean; then `cpu_contended` is true", "batches")
    rounds_dropped: Optional[int] = doc(
        "rounds (one batch of the public call and of each layer) left out because a batch in them lost the CPU: "
        "`batch_us_per_call` has `batches` minus this many values", "rounds")
    cpu_wait_fraction: Optional[float] = doc(
        "run-queue wait (fallback: time off the CPU) over the wall time of every timed batch", "fraction")
    cpu_contended: Optional[bool] = doc(
        "more than half the batches lost the CPU, or the number includes contended batches: a busy machine "
        "(also in `warnings`)")
    cpu_contended_why: Optional[str] = doc("what `cpu_contended` means for this number, in words")
    layers: Optional[dict[str, Any]] = doc("host time of each deeper entry point of the op")


class CaseSeconds(OpenPart):
    prepare_check: Optional[float] = doc("prepare and correctness check", "s")
    timing: Optional[float] = doc("warmup and timed batches, retries included", "s")
    profile: Optional[float] = doc("kernel breakdown, trace and counters replay", "s")
    total: Optional[float] = doc("the whole case, release included", "s")
    started_unix_s: Optional[float] = doc(
        "when the case started, wall clock (Unix time): with `total`, when its worker was busy; the gaps "
        "between one worker's cases are the sweep's own cost (handing out cases, rows, memory checks)", "s")


class WorkerDevice(Part):
    """The device the row was measured on (a sweep's rows come from several)."""

    kind: Optional[str] = doc("`cuda` (also ROCm) or `cpu`")
    name: Optional[str] = doc("device name")
    uuid: Optional[str] = doc("GPU UUID, when known")
    pci_bus_id: Optional[str] = doc("PCI bus id, when known")
    index: Optional[int] = doc("device index inside the worker's process, when known")


class MemoryCheck(OpenPart):
    """Did the case give its memory back (run/memory_watch.py)? Read before the case and after its release."""

    before: Optional[dict[str, Any]] = doc("`host_rss_bytes`, `device_allocated_bytes` before the case", "bytes")
    after: Optional[dict[str, Any]] = doc("the same after the case's release", "bytes")
    host_growth_bytes: Optional[int] = doc("resident set growth over the case", "bytes")
    device_growth_bytes: Optional[int] = doc("torch allocator growth over the case (a leak above the limit makes "
                                             "the row `error`, kind `leak`)", "bytes")
    first_use: Optional[bool] = doc("true when the device growth past the limit was taken as the op type's one-time "
                                    "state in this worker (its first such case, up to `first_use_limit_device_mib`): "
                                    "not a leak; a second such case of the op type in the worker is")


class Placement(Part):
    """Where the operands lay: the case measured at several device addresses (`--placements N`).

    The same kernel on the same data can run several % longer at one address than at another; the
    median over placements is a number that does not depend on where one allocator put them."""

    count: int = doc("placements measured: the backend prepared the case this many times, each behind a "
                     "padding allocation of its own size", "count")
    requested: int = doc("placements asked for (`--placements`)", "count")
    per_placement_us: list[float] = doc("each placement's median over its samples (its rounds pooled); the row's "
                                        "`latency_us` is the median of these", "µs")
    per_placement_busy_us: Optional[list[float]] = doc("each placement's median busy time, where the timer "
                                                       "gives it; `busy_us` is their median", "µs")
    spread_pct: float = doc("(slowest − fastest placement) / latency_us × 100: a difference between two rows "
                            "under this is not shown to be caused by the code", "%")
    pad_bytes: list[int] = doc("the padding allocated before each placement was prepared", "bytes")
    rounds: int = doc("rounds over the placements, in mirrored order (0..N−1, then N−1..0, ...), so a drift "
                      "in clocks does not line up with one placement", "count")
    fewer_why: Optional[str] = doc("why fewer placements than asked were measured (device memory)")
