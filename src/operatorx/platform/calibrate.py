"""This GPU's own peak rates: measured once per device and software stack, cached on disk.

A datasheet peak is what the vendor's card does at its boost clock with an ideal kernel; what a
card reaches here depends on its driver, power limit, cuBLAS and torch. `% peak` against the
datasheet then says as much about that gap as about the kernel in the row. So each sweep worker
loads (or, the first time, measures) its GPU's peaks before its first case (run/job.py):

- bf16: the best TFLOP/s of `torch.matmul` over a few large square and rectangular GEMMs;
- fp8: the same with `torch._scaled_mm` (e4m3 operands, tensor-wise scales, bf16 out), with and
  without fast accumulation;
- memory: a large device-to-device copy, bytes read + written / time.

A worker's GPU may have sat idle at its lowest clocks: before the first measured shape, the first
bf16 GEMM runs for `WARM_S` of synchronized wall time so the clocks have ramped up (a peak
measured on a cold card would be cached and used for the whole run), and the SM clock NVML reads
while it still runs is kept with the peaks. Each rate is then timed with CUDA events around
back-to-back calls after a few more warmup calls: the kernels take milliseconds, so the events'
microsecond resolution and launch gaps do not matter. All of it takes two to four seconds.

The warmup rests after each call as long as the call took, and each timed repeat is preceded by
a rest as long as itself. A card driven flat out hits its power cap and reads low (method v2,
which warmed up back to back, did), while cases are timed out of the cap (measure/retry.py).
Peaks under the cap would put such cases above 100%. The
cache is keyed by GPU name and UUID, driver, torch and CUDA (or HIP) version and the method's
version: any of them changing measures again; `operatorx run --recalibrate` forces it.

Nothing here imports torch or touches CUDA at import time, and only `measure_peaks` uses CUDA: the
sweep's parent process must never create a context (run/worker.py), so only workers call it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from operatorx.platform.device import DeviceInfo
from operatorx.platform.peaks import Peaks, peaks_for
from operatorx.user_cache import cache_root

__all__ = ["ENV_PEAKS_DIR", "METHOD_VERSION", "StackKey", "MeasuredPeaks", "CacheEntry", "stack_key", "peaks_dir",
           "load_or_measure", "measure_peaks", "device_peaks", "GEMM_SHAPES"]

ENV_PEAKS_DIR = "OPERATORX_PEAKS_DIR"
"""Environment variable naming the cache directory (tests point it at a temporary one)."""

METHOD_VERSION = 3
"""Bumped whenever what `measure_peaks` does changes: every cached entry is then measured again.
2: a 1 s warmup before the first shape (v1's peaks may have been measured before the clocks ramped).
3: the warmup and the timed repeats rest the GPU (v2's back-to-back warmup left it power-capped)."""

GEMM_SHAPES: tuple[tuple[int, int, int], ...] = ((8192, 8192, 8192), (4096, 16384, 8192), (16384, 16384, 16384))
"""(m, n, k) of the GEMMs whose best rate is the compute peak: large enough that every SM runs
full tiles for milliseconds, square and rectangular because cuBLAS's best tile differs by shape."""

COPY_BYTES = 2 << 30
"""Bytes of the copied buffer (read once, written once a copy): far beyond any L2, so HBM is the bound."""

WARM_S = 1.0
"""Seconds the first bf16 GEMM runs back to back (synchronized) before anything is timed: an idle
GPU takes a fraction of a second to leave its lowest clocks, and three warmup calls of ~1 ms do not."""

_TARGET_MS = 30.0   # each timed repeat: back-to-back calls for about this long
_REPEATS = 3        # the best repeat's mean counts (a repeat slowed by anything else on the host is dropped)

How = Literal["cached", "measured", "recalibrated", "kept from this run", "unreadable cache, measured",
              "not measured"]


class StackKey(BaseModel):
    """What the measured peaks hold for: the card, its driver, and the software that drives it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu_name: str
    gpu_uuid: Optional[str]
    driver: Optional[str]
    torch: str
    runtime: Optional[str]
    """`cuda 12.8` or `hip 6.4`, torch's own build."""
    method: int = METHOD_VERSION

    def file_name(self) -> str:
        """One file per key: the card's UUID (or name) for a reader, a hash of the whole key to tell
        stacks apart (two environments on one card keep one file each instead of re-measuring in turn)."""
        digest = hashlib.sha256(json.dumps(self.model_dump(), sort_keys=True).encode()).hexdigest()[:16]
        slug = re.sub(r"[^A-Za-z0-9_.-]", "_", self.gpu_uuid or self.gpu_name)[:64]
        return f"{slug}-{digest}.json"


class MeasuredPeaks(BaseModel):
    """One measurement of a card's peaks."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    tflops: dict[str, float]
    """Compute peak by class (`bf16`, `fp8`), TFLOP/s: only the classes that could be measured."""
    memory_gbps: Optional[float]
    """Device-to-device copy bandwidth, GB/s (bytes read + written / time)."""
    best_shapes: dict[str, str]
    """`MxNxK` of the GEMM that gave each class's peak (` fast_accum` where fp8's came with it)."""
    measured_at: str
    """ISO time (UTC) of the measurement."""
    seconds: float
    """How long measuring took."""
    run_id: Optional[str] = None
    """The run whose worker measured it (a replaced worker of a `--recalibrate` run keeps it)."""
    notes: list[str] = []
    """What could not be measured, and why (fp8 on a card without it, out of memory)."""
    warm_s: Optional[float] = None
    """Seconds of the warmup before the first timed shape (about `WARM_S`)."""
    sm_clock_mhz: Optional[float] = None
    """SM clock NVML read while the warmup's last GEMMs ran, MHz (None without NVML): far under
    `max_sm_clock_mhz`, the peaks were measured on a card held below its boost clock."""
    max_sm_clock_mhz: Optional[float] = None
    """The card's maximum SM clock (NVML), MHz."""

    @field_validator("tflops")
    @classmethod
    def _positive_rates(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: x for k, x in v.items() if not (math.isfinite(x) and x > 0)}
        if bad:
            raise ValueError(f"tflops must be positive, got {bad}")
        return v

    @field_validator("memory_gbps")
    @classmethod
    def _positive_bandwidth(cls, v: Optional[float]) -> Optional[float]:
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ValueError(f"memory_gbps must be positive, got {v}")
        return v

    def source(self) -> str:
        """How the row's `Peak.source` names these peaks."""
        return f"measured {self.measured_at[:10]} on this GPU (operatorx calibrate v{METHOD_VERSION})"


class CacheEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    key: StackKey
    peaks: MeasuredPeaks


def stack_key(device: DeviceInfo) -> StackKey:
    """The cache key of a CUDA device (imports torch for its version; creates no CUDA context)."""
    import torch

    return StackKey(gpu_name=device.name, gpu_uuid=device.uuid, driver=device.driver, torch=torch.__version__,
                    runtime=device.runtime)


def peaks_dir() -> Path:
    """`$OPERATORX_PEAKS_DIR`, else the user cache root's `peaks` (`$XDG_CACHE_HOME/operatorx/peaks`, else
    `~/.cache/operatorx/peaks`)."""
    if os.environ.get(ENV_PEAKS_DIR):
        return Path(os.environ[ENV_PEAKS_DIR])
    return cache_root(os.environ) / "peaks"


def _warn(line: str) -> None:
    print(f"operatorx: warning: {line}", file=sys.stderr, flush=True)


def _read(path: Path, key: StackKey, warn: Callable[[str], None]) -> tuple[Optional[MeasuredPeaks], bool]:
    """The cached peaks for `key` and whether the file was unreadable (a missing file is not)."""
    try:
        raw = path.read_bytes()     # bytes: a binary (corrupt) file is invalid JSON below, not a UnicodeDecodeError
    except (FileNotFoundError, NotADirectoryError):      # never measured (a bad directory: writing says so)
        return None, False
    except OSError as err:
        warn(f"peaks cache {path}: cannot read ({err.strerror or err}); measuring again")
        return None, True
    try:
        entry = CacheEntry.model_validate_json(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "file"
        warn(f"peaks cache {path}: unreadable ({where}: {first.get('msg', 'invalid')}); measuring again")
        return None, True
    if entry.key != key:        # a hand-edited file or a hash collision: the entry is another stack's
        warn(f"peaks cache {path}: holds peaks of another device or stack; measuring again")
        return None, True
    return entry.peaks, False


def _write(path: Path, entry: CacheEntry, warn: Callable[[str], None]) -> None:
    """Atomically (a reader never sees half a file); a cache that cannot be written costs a warning."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(entry.model_dump_json(indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as err:
        warn(f"peaks cache {path}: cannot write ({err.strerror or err}); the peaks hold for this run only")


def load_or_measure(key: StackKey, measure: Optional[Callable[[], MeasuredPeaks]], *, recalibrate: bool = False,
                    run_id: Optional[str] = None, directory: Optional[Path] = None,
                    warn: Callable[[str], None] = _warn) -> tuple[Optional[MeasuredPeaks], How]:
    """The peaks for `key`: from the cache, or measured now (and cached) when there are none, when
    the cache file is unreadable, or on `recalibrate` — unless this run already recalibrated them
    (a worker started again mid-run keeps its run's peaks). `measure=None`: the cache only."""
    path = (directory or peaks_dir()) / key.file_name()
    cached, unreadable = _read(path, key, warn)
    if cached is not None and (not recalibrate or (run_id is not None and cached.run_id == run_id)):
        return cached, "kept from this run" if recalibrate else "cached"
    if measure is None:
        return None, "not measured"
    try:
        peaks = measure().model_copy(update={"run_id": run_id})
    except Exception as err:  # noqa: BLE001 - no measured peaks is not the run's failure: the datasheet stays
        warn(f"peaks of {key.gpu_name}: measuring failed ({type(err).__name__}: {str(err).strip()[:200]}); "
             f"using the datasheet")
        return None, "not measured"
    _write(path, CacheEntry(key=key, peaks=peaks), warn)
    return peaks, "unreadable cache, measured" if unreadable else "recalibrated" if recalibrate else "measured"


def device_peaks(device: DeviceInfo, *, recalibrate: bool = False, run_id: Optional[str] = None,
                 measure: Optional[Callable[[], MeasuredPeaks]] = None, measure_now: bool = True,
                 directory: Optional[Path] = None,
                 warn: Callable[[str], None] = _warn) -> tuple[Optional[Peaks], dict[str, Any]]:
    """A worker's peaks for its device: the datasheet's with the measured ones beside them, and what
    the run stores about them. A CPU device has none (as before). `measure_now=False` only reads the
    cache (the `--counters` child runs under ncu, where a measurement would be perturbed)."""
    datasheet = peaks_for(device.name)
    if device.kind != "cuda":
        return None, {"how": "not measured", "measured": None}
    key = stack_key(device)
    measured, how = load_or_measure(key, (measure or measure_peaks) if measure_now else None,
                                    recalibrate=recalibrate, run_id=run_id, directory=directory, warn=warn)
    info: dict[str, Any] = {"how": how, "file": str((directory or peaks_dir()) / key.file_name()),
                            "measured": None if measured is None else measured.model_dump(mode="json"),
                            "datasheet": None if datasheet is None else
                            {"tflops": datasheet.tflops, "memory_gbps": datasheet.memory_gbps}}
    if measured is None:
        return datasheet, info
    base = datasheet or Peaks({}, None, f"no datasheet entry for {device.name}")
    return base.with_measured(measured.tflops, measured.memory_gbps, measured.source()), info


# --- the measurement (a CUDA worker only) -------------------------------------------------------------

def _warm(fn: Callable[[], Any], sync: Callable[[], None], seconds: float) -> tuple[int, float]:
    """Call `fn`, synchronizing after each call and resting as long as it took, until `seconds` of
    wall time passed: the synchronize makes the time the GPU's, not the launch queue's, and half
    the time busy brings the clocks up without reaching the power cap. Returns (calls, seconds)."""
    t0 = time.perf_counter()
    calls = 0
    while calls == 0 or time.perf_counter() - t0 < seconds:
        t_call = time.perf_counter()
        fn()
        sync()
        calls += 1
        time.sleep(time.perf_counter() - t_call)
    return calls, time.perf_counter() - t0


def _sm_clocks(fn: Callable[[], Any]) -> tuple[Optional[float], Optional[float]]:
    """(SM clock, max SM clock) in MHz, read through NVML (measure/telemetry.py) while a few calls of
    `fn` are queued, so the card is busy when it is read; (None, None) where NVML has no answer."""
    import torch

    from operatorx.measure.telemetry import Telemetry

    try:
        reader = Telemetry.for_torch_device(torch.cuda.current_device())
        for _ in range(10):         # ~14 ms of H200 bf16 GEMMs queued: longer than the few NVML reads
            fn()
        reading = reader.sample()
    except Exception:  # noqa: BLE001 - the clock is a note on the peaks, never a reason to lose them
        reading = {}
    torch.cuda.synchronize()

    def mhz(value: Any) -> Optional[float]:
        return float(value) if isinstance(value, (int, float)) and value > 0 else None
    return mhz(reading.get("sm_clock_mhz")), mhz(reading.get("max_sm_clock_mhz"))


def _best_ms(fn: Callable[[], Any]) -> float:
    """Milliseconds per call of `fn`: warmed up, then the best of `_REPEATS` CUDA-event-timed runs
    of back-to-back calls, each about `_TARGET_MS` long and each after a rest as long."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    calls = max(5, min(200, int(_TARGET_MS / max(start.elapsed_time(end), 1e-3))))
    best = math.inf
    for _ in range(_REPEATS):
        time.sleep(_TARGET_MS * 1e-3)       # rest as long as a repeat: each one starts out of the power cap
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / calls)
    return best


def _gemm_call(kind: str, m: int, n: int, k: int, fast_accum: bool = False) -> Callable[[], Any]:
    """One GEMM of `kind` on fresh random operands (`bf16`: matmul; `fp8`: _scaled_mm, e4m3, tensor-wise
    scales of 1, bf16 out, fp32 accumulation promoted periodically or, `fast_accum`, not). B is stored
    (n, k) and used transposed: the layout of a linear layer's weight, and the one `_scaled_mm` requires."""
    import torch

    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    if kind == "bf16":
        return lambda: torch.matmul(a, b.t())
    f8 = torch.float8_e4m3fnuz if getattr(torch.version, "hip", None) else torch.float8_e4m3fn
    a8, b8 = a.to(f8), b.to(f8).t()     # the bf16 operands are freed when this returns
    one = torch.ones((), device="cuda", dtype=torch.float32)
    return lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                    use_fast_accum=fast_accum)


def _gemm_peak(kind: str, shapes: tuple[tuple[int, int, int], ...]) -> tuple[float, str]:
    """Best TFLOP/s over `shapes` for `kind` (fp8: with and without fast accumulation, the faster
    counts: fp8 kernels use either), and the shape that gave it."""
    best, best_shape = 0.0, ""
    for m, n, k in shapes:
        for fast in ((False, True) if kind == "fp8" else (False,)):
            ms = _best_ms(_gemm_call(kind, m, n, k, fast))      # the operands go with the call when it returns
            tflops = 2.0 * m * n * k / (ms * 1e-3) / 1e12
            if tflops > best:
                best, best_shape = tflops, f"{m}x{n}x{k}" + (" fast_accum" if fast else "")
    return best, best_shape


def _copy_gbps(nbytes: int) -> float:
    """GB/s of `dst.copy_(src)` on `nbytes` buffers, counting the bytes read and the bytes written."""
    import torch

    src = torch.ones(nbytes, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    ms = _best_ms(lambda: dst.copy_(src))
    return 2.0 * nbytes / (ms * 1e-3) / 1e9


def measure_peaks(shapes: tuple[tuple[int, int, int], ...] = GEMM_SHAPES,
                  copy_bytes: int = COPY_BYTES) -> MeasuredPeaks:
    """Measure the current CUDA device's bf16 and fp8 GEMM peaks and its copy bandwidth (2-3 s, 1 s of
    it the warmup that brings an idle card's clocks up).
    A class that cannot run (no fp8 on the card, out of memory) is left out and noted."""
    import torch

    t0 = time.perf_counter()
    tflops: dict[str, float] = {}
    best_shapes: dict[str, str] = {}
    notes: list[str] = []
    free, _ = torch.cuda.mem_get_info()
    warm_s: Optional[float] = None
    clock: tuple[Optional[float], Optional[float]] = (None, None)
    try:
        first = _gemm_call("bf16", *shapes[0])
        warm_s = round(_warm(first, torch.cuda.synchronize, WARM_S)[1], 3)
        clock = _sm_clocks(first)
        del first
    except Exception as err:  # noqa: BLE001 - measured cold is still measured; the note says so
        notes.append(f"warmup: {type(err).__name__}: {str(err).strip().splitlines()[0][:200] if str(err) else ''}")
    for kind in ("bf16", "fp8"):
        if kind == "fp8" and not hasattr(torch, "_scaled_mm"):
            notes.append("fp8: this torch has no _scaled_mm")
            continue
        try:
            tflops[kind], best_shapes[kind] = _gemm_peak(kind, shapes)
        except Exception as err:  # noqa: BLE001 - one class not measured; the datasheet stays for it
            notes.append(f"{kind}: {type(err).__name__}: {str(err).strip().splitlines()[0][:200] if str(err) else ''}")
        torch.cuda.empty_cache()
    memory_gbps: Optional[float] = None
    nbytes = min(copy_bytes, int(free * 0.4) // 2)      # two buffers, well inside what is free
    try:
        if nbytes < 256 << 20:      # a copy that fits in a few L2s measures the cache, not HBM
            raise MemoryError(f"{free >> 20} MiB free: too little for a copy that bypasses the L2")
        memory_gbps = _copy_gbps(nbytes)
    except Exception as err:  # noqa: BLE001 - as above
        notes.append(f"memory: {type(err).__name__}: {str(err).strip().splitlines()[0][:200] if str(err) else ''}")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()        # the worker's memory watch and the cases get the memory back
    return MeasuredPeaks(tflops=tflops, memory_gbps=memory_gbps, best_shapes=best_shapes,
                         measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                         seconds=round(time.perf_counter() - t0, 3), notes=notes, warm_s=warm_s,
                         sm_clock_mhz=clock[0], max_sm_clock_mhz=clock[1])
