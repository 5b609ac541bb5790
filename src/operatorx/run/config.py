"""A run's configuration, frozen and checked before any device work.

It travels: to each worker process (as JSON over the worker's pipe, `worker_json`: without the
database, which workers never open) and into documents and the store (`to_json`: the database's
password hidden), so `--resume` runs the missing cases with the settings of the original run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Optional

from operatorx.measure.host_time import HostTimeSettings
from operatorx.measure.settings import TimingSettings

__all__ = ["RunConfig", "Executor", "EXECUTORS", "Shard", "parse_shard"]

Executor = Literal["local", "inline", "ray"]
EXECUTORS: tuple[Executor, ...] = ("local", "inline", "ray")

MAX_PLACEMENTS = 8
"""More placements than this cost more than they tell (each holds its own copy of the operands)."""

#: Seconds a worker may take to start (import torch, create the CUDA context, probe the L2 states).
WORKER_START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count`: the cases whose key hashes to `index` (see run/plan.py)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"--shard {self.index}/{self.count}: use I/N with 0 <= I < N")

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """`I/N` → Shard(I, N)."""
    index, slash, count = text.partition("/")
    try:
        if not slash:
            raise ValueError
        return Shard(int(index), int(count))
    except ValueError as err:
        raise ValueError(f"--shard {text!r}: use I/N with 0 <= I < N, e.g. 0/4") from err


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    testlist: str
    """A shipped testlist name or a path."""
    backend: str = "torch"
    device: Optional[str] = None
    """cuda, cpu, or None for cuda when there is a GPU."""
    filter: Optional[str] = None
    """Keep cases whose label, scheme or sources contain this text."""
    limit: Optional[int] = None
    db: str = "operatorx.db"
    """The `--db` as given (a password included): read by this process only. Documents and the store
    keep its display form; a config read back from JSON without one holds "" (no database)."""
    results_dir: Path = Path("operatorx-results")
    timing: TimingSettings = field(default_factory=TimingSettings)
    cpu_max_gflop: float = 50.0
    """On the CPU device, cases above this much work are `unsupported`: a CPU would take minutes a call."""
    cpu_max_gb: float = 4.0
    """On the CPU device, cases that move more than this many GB a call (their weights, mostly) are
    `unsupported`: few FLOPs over many GB still take tens of seconds a call there."""
    profile_kernels: bool = True
    """Per-kernel breakdown of each case (`metrics["profile"]`), from the timed CUPTI records."""
    trace_dir: Optional[Path] = None
    """Write each case's last profiled batch as a Perfetto-readable trace here."""
    check_l2: bool = True
    """Probe at the start of a CUDA run that the flushes give the L2 states they claim."""
    counters_child: bool = False
    """This run is the child of `--counters`, running under ncu: replay each op once in an NVTX
    range for ncu, and mark the latencies perturbed."""
    run_id: Optional[str] = None
    """Use this run id instead of a new one (the `--counters` parent picks it for its child)."""
    host: bool = False
    """Also measure host µs per call (and per layer) after device timing: `metrics["host"]`."""
    host_timing: HostTimeSettings = field(default_factory=HostTimeSettings)
    rank_local: bool = False
    """Time one rank's shard of each split case (tp·dp > 1) on one device, collectives left out, and
    say so on its row (spec/shard.py); without it such a case is `unsupported` with the GPUs it needs."""
    placements: int = 1
    """Time each case at this many operand placements (run/placements.py) and report the median over
    them: a number that does not depend on where one allocator put the operands. 1: as allocated."""
    recalibrate: bool = False
    """Measure each GPU's peaks again (platform/calibrate.py) instead of reading the cached ones."""

    # --- the sweep ---------------------------------------------------------------------------
    executor: Executor = "local"
    """local: one worker process per GPU (or `workers` on the CPU), isolated from each other and
    from this process; ray: one Ray actor per GPU owning the same worker process; inline: in this
    process, no isolation (a debugger's and a unit test's mode)."""
    gpus: Optional[tuple[int, ...]] = None
    """CUDA devices to use, by index among the visible ones; None = all visible."""
    workers: int = 1
    """Worker processes on the CPU device (each gets its share of the cores)."""
    case_timeout_s: Optional[float] = None
    """A case running longer than this is stopped (`timeout`); None = derived from the timing budget."""
    compile_grace_s: float = 600.0
    """How much longer than its deadline a case may run while its worker compiles kernels (a cold JIT
    cache: nvcc, ptxas, ninja, gcc in the worker's session, run/compiling.py); 0 = never longer."""
    grace_s: float = 10.0
    """On SIGINT/SIGTERM, cases in flight get this long to end before they are stopped."""
    shard: Optional[Shard] = None
    run_group: Optional[str] = None
    """Ties the shards (or hosts) of one logical sweep together."""
    ray_address: Optional[str] = None
    leak_limit_device_mib: float = 256.0
    """Device memory a case may leave allocated after its release before its worker is replaced."""
    leak_limit_host_mib: float = 2048.0
    """Host memory (resident set growth) a case may leave behind before its worker is replaced."""
    first_use_limit_device_mib: float = 1024.0
    """Device memory the first case of an op type in a worker may keep past `leak_limit_device_mib` as its
    kernels' one-time state (run/memory_watch.py); at or below the leak limit, none is admitted."""

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit must be >= 1, got {self.limit}")
        if not self.cpu_max_gflop > 0:
            raise ValueError("cpu_max_gflop must be > 0")
        if not self.cpu_max_gb > 0:
            raise ValueError("cpu_max_gb must be > 0")
        if self.executor not in EXECUTORS:
            raise ValueError(f"--executor {self.executor}: use one of {', '.join(EXECUTORS)}")
        if not 1 <= self.placements <= MAX_PLACEMENTS:
            raise ValueError(f"--placements must be 1..{MAX_PLACEMENTS}, got {self.placements}")
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        if self.case_timeout_s is not None and not self.case_timeout_s > 0:
            raise ValueError(f"--case-timeout must be > 0 seconds, got {self.case_timeout_s}")
        if not self.compile_grace_s >= 0:
            raise ValueError(f"--compile-grace must be >= 0 seconds, got {self.compile_grace_s}")
        if not self.grace_s >= 0:
            raise ValueError(f"--grace must be >= 0 seconds, got {self.grace_s}")
        limits_mib = (self.leak_limit_device_mib, self.leak_limit_host_mib, self.first_use_limit_device_mib)
        if not all(limit >= 0 for limit in limits_mib):
            raise ValueError("leak limits must be >= 0 MiB")

    def case_deadline_s(self) -> float:
        """How long one case may take before it is stopped: the sampling budget of every capped
        retry at each placement, the host timing, and a generous minute for prepare, check and
        profile (half a minute more for each further placement's prepare)."""
        if self.case_timeout_s is not None:
            return self.case_timeout_s
        t = self.timing
        sampling = (1 + t.throttle_retries) * min(t.max_time_s + 5.0, t.timeout_s)
        if self.placements > 1:             # two rounds of each placement, each with half the time cap
            sampling = self.placements * (1 + t.throttle_retries) * min(t.max_time_s + 10.0, 2 * t.timeout_s)
        return 60.0 + 30.0 * (self.placements - 1) + sampling + (60.0 if self.host else 0.0)

    def timing_used(self, device_kind: Optional[str]) -> dict[str, Any]:
        """The timing settings a run on `device_kind` really uses: on the CPU the host clock, with no
        L2 state, spin or device timer (those settings would be stored, but never applied)."""
        t = self.timing.to_json()
        if device_kind != "cpu":
            return t
        kept = ("warmup_calls", "warmup_floor_s", "first_warmup_floor_s", "min_samples", "max_samples",
                "noise_target", "max_time_s", "timeout_s")
        return {"mode": "host_clock", **{k: t[k] for k in kept}}

    # --- (de)serialisation: to workers and into the store ----------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The record documents, the store and `--resume` keep: `db` in its display form (a URL's
        password as `***`), so a shared document or database never carries the secret."""
        from operatorx.store.redact import hide_password

        out = self.worker_json()
        out["db"] = hide_password(self.db)
        return out

    def worker_json(self) -> dict[str, Any]:
        """What a worker is sent: everything but `db` (a worker stores nothing, so it gets no URL)."""
        out = asdict(self)
        del out["db"]
        out["results_dir"] = str(self.results_dir)
        out["trace_dir"] = None if self.trace_dir is None else str(self.trace_dir)
        out["gpus"] = None if self.gpus is None else list(self.gpus)
        out["shard"] = None if self.shard is None else str(self.shard)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunConfig:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in known}
        kw.setdefault("db", "")
        kw["timing"] = TimingSettings(**kw.get("timing", {}))
        kw["host_timing"] = HostTimeSettings(**kw.get("host_timing", {}))
        kw["results_dir"] = Path(kw.get("results_dir", "operatorx-results"))
        if kw.get("trace_dir") is not None:
            kw["trace_dir"] = Path(kw["trace_dir"])
        if kw.get("gpus") is not None:
            kw["gpus"] = tuple(kw["gpus"])
        if kw.get("shard") is not None:
            kw["shard"] = parse_shard(kw["shard"])
        return cls(**kw)
