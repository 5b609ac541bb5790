"""Timing knobs. Defaults are the published OperatorX method A."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

__all__ = ["TimingSettings"]


@dataclass(frozen=True, kw_only=True)
class TimingSettings:
    warmup_calls: int = 5
    """Calls before timing, at least; the wall-clock floors below may add more."""
    warmup_floor_s: float = 0.025
    """Warm up for at least this long (clocks ramp, caches and autotuners settle)."""
    first_warmup_floor_s: float = 1.0
    """The floor for the first op of a process: an idle GPU needs longer to reach its clocks."""
    min_samples: int = 10
    """The median is taken over at least this many timed calls."""
    max_samples: int = 200
    """Stop after this many timed calls."""
    min_time_s: float = 0.05
    """Keep sampling (up to max_samples) until the timed calls add up to this much device time."""
    timeout_s: float = 30.0
    """Wall-clock limit of one measurement; a timeout is recorded as the stop reason."""
    batch_size: int = 32
    """Timed calls enqueued behind one GPU spin."""
    spin: bool = True
    """Enqueue a GPU spin (torch.cuda._sleep) ahead of each batch so launch gaps are hidden."""
    flush_l2: bool = True
    """Zero a buffer before every timed call so each call starts with a cold L2."""
    flush_bytes: Optional[int] = None
    """Size of that buffer; None means the device's L2 size."""
    throttle_retries: int = 1
    """Measure again (after `throttle_rest_s`) when the GPU reported a clock cap during timing."""
    throttle_rest_s: float = 2.0

    def __post_init__(self) -> None:
        for name in ("warmup_calls", "min_samples", "max_samples", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"timing.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_samples < self.min_samples:
            raise ValueError(f"timing.max_samples ({self.max_samples}) < min_samples ({self.min_samples})")
        for name in ("warmup_floor_s", "first_warmup_floor_s", "min_time_s", "timeout_s", "throttle_rest_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"timing.{name} must be >= 0")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
