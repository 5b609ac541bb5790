"""The parts every timing strategy shares: warmup with a wall-clock floor, and when to stop."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Optional

from operatorx.measure.settings import TimingSettings
from operatorx.measure.stats import median_noise

__all__ = ["GiveUp", "Warmed", "capped_stop", "mark_process_warmed", "warmup", "stop_reason"]

GiveUp = Callable[[float], bool]
"""Asked after each batch with the perf_counter time the timed calls began: True when the GPU's
telemetry already shows the attempt capped (measure/retry.py), so sampling it on is wasted."""

_process_warmed = False


def mark_process_warmed() -> None:
    """The GPU's clocks are already up (measure/clock_ramp.py): the first op gets the usual floor."""
    global _process_warmed
    _process_warmed = True


class Warmed(NamedTuple):
    calls: int
    seconds: float
    """Wall seconds of the warmup, rests included."""
    call_s: float
    """Seconds of one synchronized call: the median over the calls after the first (which pays lazy
    set-up), the first where it is the only one. An upper bound on the call's device time."""


def warmup(fn: Callable[[], Any], sync: Callable[[], None], settings: TimingSettings,
           rest_s: float = 0.0, rest_long_calls: bool = False) -> Warmed:
    """Call fn until both `warmup_calls` calls and the wall-clock floor have passed.

    Each call is synchronized, so the floor counts real device time, not queued launches.
    The first op of a process gets the longer floor, to bring an idle GPU's clocks up, and rests
    after each call as long as the call took, so that floor does not drive a prefill GEMM into
    the power cap by itself (half busy keeps the clocks up, as calibrate's warmup, which does the
    same, shows). `rest_s`: a
    rested retry rests after each warmup call too, or a long GEMM's warmup alone would bring the
    power cap back before its first timed call, and needs one call, not `warmup_calls`, besides
    the floor. With `rest_long_calls` (GPU timers), a call of `rested_call_s` or longer rests as long
    as it took, as its timed calls will (settings.rested_pause_s).
    """
    global _process_warmed
    floor_s = settings.warmup_floor_s if _process_warmed else settings.first_warmup_floor_s
    # a rested attempt is a retry of an op that has just been warmed up and timed: one call re-primes
    # it (five of a 20 ms GEMM, each rested as long, took 0.2-0.3 s of every retry)
    min_calls = 1 if rest_s > 0 and _process_warmed else settings.warmup_calls
    start = time.perf_counter()
    calls = 0
    first = not _process_warmed
    call_times: list[float] = []
    while calls < min_calls or time.perf_counter() - start < floor_s:
        t_call = time.perf_counter()
        fn()
        sync()
        calls += 1
        took = time.perf_counter() - t_call
        call_times.append(took)
        rest = max(rest_s, took if first else settings.rested_pause_s(took) if rest_long_calls else 0.0)
        if rest > 0:
            time.sleep(rest)
    _process_warmed = True
    later = sorted(call_times[1:] or call_times)
    return Warmed(calls, time.perf_counter() - start, later[len(later) // 2])


def stop_reason(samples_us: Sequence[float], wall_s: float, settings: TimingSettings) -> Optional[str]:
    """None to keep going; else why to stop.

    - `noise_target`: at least `min_samples`, and the median is known to `noise_target`;
    - `time_cap`: at least `min_samples`, but `max_time_s` (or the hard `timeout_s`, when it is
      the shorter) of sampling did not get there (the row keeps the noise it reached, so a
      reader sees how sure the number is);
    - `max_samples`;
    - `timeout`: `timeout_s` passed before `min_samples` (a prefill GEMM of seconds per call).
    """
    n = len(samples_us)
    if n >= settings.max_samples:
        return "max_samples"
    if n >= settings.min_samples:
        if median_noise(samples_us) <= settings.noise_target:
            return "noise_target"
        if wall_s >= min(settings.max_time_s, settings.timeout_s):
            return "time_cap"
    if wall_s >= settings.timeout_s and n >= 1:
        return "timeout"
    return None


def capped_stop(give_up: Optional[GiveUp], window_start_s: float, samples: int) -> Optional[str]:
    """`capped` when there are samples and `give_up` says the attempt is already capped, else None."""
    if give_up is not None and samples > 0 and give_up(window_start_s):
        return "capped"
    return None
