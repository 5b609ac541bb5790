"""What a timing strategy returns: the samples and how they were taken."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Measurement"]


@dataclass(frozen=True)
class Measurement:
    method: str                    # e.g. "cuda_events/spin+flush" or "host_clock/perf_counter"
    clock: str                     # "device" (GPU events) or "host" (CPU wall clock)
    samples_us: list[float]
    summary: dict[str, float]      # from stats.summarize
    warmup_calls: int
    warmup_s: float
    stop_reason: str               # "criterion", "max_samples" or "timeout"
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def latency_us(self) -> float:
        return self.summary["median"]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
