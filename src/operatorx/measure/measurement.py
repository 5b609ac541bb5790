"""What a timing strategy returns: the samples and how they were taken."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from operatorx.measure.record import Record

__all__ = ["Measurement", "NotMeasurable", "R"]

R = TypeVar("R", bound=Record, covariant=True)
"""The timer's record type (measure/record.py)."""


class NotMeasurable(Exception):
    """The op cannot be timed the way asked (e.g. it cannot be captured in a CUDA graph): the row
    is `unsupported` with this reason, never timed some other way."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Measurement(Generic[R]):
    method: str                    # "cupti_kernels", "cupti_kernels/cuda_graph", "cuda_events", "host_clock/..."
    clock: str                     # "device" (GPU timestamps) or "host" (CPU wall clock)
    samples_us: list[float]
    summary: dict[str, float]      # from stats.summarize
    warmup_calls: int
    warmup_s: float
    stop_reason: str               # "noise_target", "time_cap", "max_samples", "timeout", "capped" (or "batches")
    details: R
    """What the timer saw while sampling, typed and closed (measure/record.py)."""
    last_batch: Any = field(default=None, repr=False, compare=False)
    """The last profiled batch (measure/trace.py), for the kernel breakdown and `--trace`; not stored."""

    @property
    def latency_us(self) -> float:
        return self.summary["median"]

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "clock": self.clock, "samples_us": self.samples_us, "summary": self.summary,
                "warmup_calls": self.warmup_calls, "warmup_s": self.warmup_s, "stop_reason": self.stop_reason,
                "details": self.details.stored()}
