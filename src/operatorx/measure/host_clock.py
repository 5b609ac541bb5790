"""Timing on the CPU device: the host clock around each call. No GPU is involved, and rows say so."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from operatorx.measure.l2 import L2Flusher
from operatorx.measure.loop import stop_reason, warmup
from operatorx.measure.measurement import Measurement
from operatorx.measure.settings import TimingSettings
from operatorx.measure.stats import summarize

__all__ = ["HostClockTiming"]


class HostClockTiming:
    method = "host_clock/perf_counter"

    def __init__(self, settings: TimingSettings):
        self.settings = settings
        # The timer protocol (run/case.py `Timer`) has a flusher that callers flush around traced
        # calls; the CPU has no L2 state to produce, so it is the warm (do-nothing) one.
        self.flusher = L2Flusher("warm", None)

    def measure(self, fn: Callable[[], Any], pause_s: float = 0.0) -> Measurement:
        s = self.settings
        calls, warm_s = warmup(fn, lambda: None, s)
        samples_us: list[float] = []
        start = time.perf_counter()
        reason = None
        while reason is None:
            t0 = time.perf_counter_ns()
            fn()
            samples_us.append((time.perf_counter_ns() - t0) / 1e3)
            if pause_s > 0:
                time.sleep(pause_s)
            reason = stop_reason(samples_us, time.perf_counter() - start, s)
        return Measurement(method=self.method, clock="host", samples_us=samples_us,
                           summary=summarize(samples_us), warmup_calls=calls, warmup_s=warm_s,
                           stop_reason=reason, details={"l2_state": "n/a (cpu)", "spin": False})
