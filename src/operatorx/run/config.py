"""A run's configuration, frozen and checked before any device work."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from operatorx.measure.host_time import HostTimeSettings
from operatorx.measure.settings import TimingSettings

__all__ = ["RunConfig"]


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
    results_dir: Path = Path("operatorx-results")
    timing: TimingSettings = field(default_factory=TimingSettings)
    cpu_max_gflop: float = 50.0
    """On the CPU device, cases above this much work are `unsupported`: a CPU would take minutes a call."""
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

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit must be >= 1, got {self.limit}")
        if self.cpu_max_gflop <= 0:
            raise ValueError("cpu_max_gflop must be > 0")
