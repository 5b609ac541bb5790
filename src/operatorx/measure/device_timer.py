"""The CUDA timer a run asks for (`--timing kernels|events|graph`, `--l2 STATE`), built in one place
so `run` and `ab` time the same way."""

from __future__ import annotations

from typing import Any, Optional

from operatorx.measure.l2 import L2Flusher
from operatorx.measure.settings import TimingSettings

__all__ = ["device_timer"]


def device_timer(settings: TimingSettings, l2_bytes: Optional[int], sm_clock_hz: Optional[float]) -> Any:
    """A timer with `.method`, `.flusher` and `.measure(fn, pause_s=0.0, give_up=None) -> Measurement`."""
    flusher = L2Flusher(settings.l2_state, l2_bytes, settings.flush_bytes)
    clock_hz = sm_clock_hz or 2.0e9
    if settings.mode == "events":
        from operatorx.measure.events import EventTiming

        return EventTiming(settings, flusher, clock_hz)
    from operatorx.measure.kernel_timing import KernelTiming

    return KernelTiming(settings, flusher, clock_hz, graph=settings.mode == "graph")
