"""Bring an idle GPU's clocks up while a worker starts, instead of in its first case.

The first op of a process warms up for `first_warmup_floor_s` (1 s): an idle GPU needs about that
long at work to reach its clocks, and a case timed sooner reads slow. A worker's own start has a
second of host-only work in it (CUPTI's start-up), so the GPU can spend that second on a spin
kernel instead. Whether it worked is read, not assumed: only when NVML shows the SM clock at its
maximum afterwards does the process count as warmed, and its first case gets the usual floor.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["ClockRamp", "start_clock_ramp"]

_CHUNK_S = 0.05     # the spin is a queue of short kernels: at an idle clock each lasts longer, not the whole


@dataclass
class ClockRamp:
    launched_s: float
    """perf_counter time the spin was queued."""
    seconds: float

    def finish(self, telemetry: Any, capped_clock_fraction: float) -> dict[str, Any]:
        """Wait for the spin, read the SM clock, and mark the process warmed when it is at its maximum.
        Returns what the worker's info keeps (`clock_ramp`)."""
        import torch

        from operatorx.measure.loop import mark_process_warmed

        torch.cuda.synchronize()
        waited_s = time.perf_counter() - self.launched_s
        reading = telemetry.sample() if getattr(telemetry, "available", False) else {}
        clock, top = reading.get("sm_clock_mhz"), reading.get("max_sm_clock_mhz")
        warmed = bool(clock and top and clock >= capped_clock_fraction * top)
        if warmed:
            mark_process_warmed()
        return {"spin_s": self.seconds, "done_after_s": round(waited_s, 4), "sm_clock_mhz": clock,
                "max_sm_clock_mhz": top, "warmed": warmed}


def start_clock_ramp(seconds: float, sm_clock_hz: Optional[float]) -> Optional[ClockRamp]:
    """Queue `seconds` of GPU spin (at the maximum clock) and return at once; None when there is
    nothing to do (no floor, or no clock to size the spin by)."""
    if seconds <= 0 or not sm_clock_hz:
        return None
    import torch

    chunks = max(1, round(seconds / _CHUNK_S))
    t0 = time.perf_counter()
    for _ in range(chunks):
        torch.cuda._sleep(int(seconds / chunks * sm_clock_hz))
    return ClockRamp(launched_s=t0, seconds=seconds)
