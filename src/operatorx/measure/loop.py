"""The parts every timing strategy shares: warmup with a wall-clock floor, and when to stop."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Optional

from operatorx.measure.settings import TimingSettings

__all__ = ["warmup", "stop_reason"]

_process_warmed = False


def warmup(fn: Callable[[], Any], sync: Callable[[], None], settings: TimingSettings) -> tuple[int, float]:
    """Call fn until both `warmup_calls` calls and the wall-clock floor have passed.

    Each call is synchronized, so the floor counts real device time, not queued launches.
    The first op of a process gets the longer floor. Returns (calls, seconds).
    """
    global _process_warmed
    floor_s = settings.warmup_floor_s if _process_warmed else settings.first_warmup_floor_s
    start = time.perf_counter()
    calls = 0
    while calls < settings.warmup_calls or time.perf_counter() - start < floor_s:
        fn()
        sync()
        calls += 1
    _process_warmed = True
    return calls, time.perf_counter() - start


def stop_reason(samples: int, measured_s: float, wall_s: float, settings: TimingSettings) -> Optional[str]:
    """None to keep going; else why to stop.

    `timeout_s` caps one measurement even before `min_samples` (a prefill GEMM of seconds per call
    cannot take 10 samples in any reasonable time); the row then says `timeout` and how many
    samples its median has.
    """
    if samples >= settings.max_samples:
        return "max_samples"
    if samples >= settings.min_samples and measured_s >= settings.min_time_s:
        return "criterion"
    if wall_s >= settings.timeout_s and samples >= 1:
        return "timeout"
    return None
