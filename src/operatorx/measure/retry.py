"""Timing with the GPU's conditions watched: telemetry around each attempt, a retry while capped.

A power or thermal cap lowers the SM clock for a while; a number taken then describes the
cap. So: measure with a telemetry sampler running; if the attempt was capped, rest the GPU (50,
100, 200 ms by default) and measure again with a pause between calls (0.5, 1, 2 ms by default,
or 1, 2, 4 times the call when longer; none for a call under 50 µs, which cannot hold the cap by
itself) that lets power and temperature fall, up to `throttle_retries` times, or until two
paused attempts agree (more rest no longer changes the number); keep the fastest uncapped
attempt (else the fastest, flagged). A call of 1 ms or more is timed rested from its first
attempt (settings.rested_call_s), and each retry doubles its pause.

An attempt that is not the last stops sampling as soon as its telemetry shows it capped (stop
reason `capped`): its number would not be kept, and a prefill GEMM that caps itself spent up
to a second finishing such an attempt. A cut-short attempt is kept only when no full one exists,
or when its median is known to CONVERGED_REL anyway (a 19 ms GEMM cut after 9 of its 10 calls).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Optional, Protocol

from operatorx.measure.loop import GiveUp
from operatorx.measure.measurement import Measurement
from operatorx.measure.record import TimerRecord
from operatorx.measure.settings import TimingSettings
from operatorx.measure.telemetry import Telemetry, TelemetrySampler

__all__ = ["Attempted", "measure_with_retries"]


class _Timer(Protocol):
    def measure(self, fn: Callable[[], Any], pause_s: float = 0.0,
                give_up: Optional[GiveUp] = None) -> Measurement[TimerRecord]: ...


_Tried = tuple[Measurement[TimerRecord], dict[str, Any], float]
"""One attempt: its measurement, its telemetry summary, and the pause it made."""


class Attempted:
    """The kept measurement, its telemetry summary, and every attempt in brief."""

    def __init__(self, measurement: Measurement[TimerRecord], telemetry: dict[str, Any],
                 attempts: list[dict[str, Any]]):
        self.measurement = measurement
        self.telemetry = telemetry
        self.attempts = attempts


CONVERGED_REL = 0.005
"""Two paused attempts in a row within this of each other: a longer rest no longer changes the number."""


def _cut_short(m: Measurement[TimerRecord]) -> bool:
    """The attempt stopped early because its telemetry showed the cap (`give_up`)."""
    return m.stop_reason == "capped"


def _paused_s(m: Measurement[TimerRecord], asked_s: float) -> float:
    """The pause the attempt really made: the timer rests a long call from the first attempt
    (settings.rested_pause_s) even when no pause was asked."""
    made = m.details.pause_s
    return made if made is not None and made > 0 else asked_s


def _next_pause_s(settings: TimingSettings, attempt: int, tried: list[_Tried]) -> float:
    """Retry k's pause: the settings' (settings.pause_s), or twice the last attempt's when that one
    already paused (a long call rested from its first attempt rests longer at each retry)."""
    if not tried:
        return 0.0
    last = tried[-1][2]
    by_settings = settings.pause_s(attempt, tried[0][0].latency_us * 1e-6)
    # doubling stops at the settings' own ceiling (200 ms with 3 retries), so a seconds-long call's
    # retries still end inside the case's deadline
    return max(by_settings, min(2 * last, settings.max_pause_s())) if last > 0 else by_settings


def _usable(m: Measurement[TimerRecord], min_samples: int) -> bool:
    """A full attempt, or one cut short (capped) after it already held `min_samples`: as good as a
    full one for choosing the number. One cut with fewer is kept only when nothing else is left."""
    return not _cut_short(m) or len(m.samples_us) >= min_samples


def _known(m: Measurement[TimerRecord], min_samples: int) -> bool:
    """Whether an attempt's number is known well enough to compare: a usable one, or one cut short
    whose median is known to CONVERGED_REL (a confidence interval needs 6 samples at least). A long
    GEMM that caps itself is cut a call or so short of `min_samples` with its median already known
    well: waiting for full attempts would run more retries that change nothing."""
    if _usable(m, min_samples):
        return True
    noise = m.summary.get("median_noise")
    return noise is not None and math.isfinite(noise) and noise <= CONVERGED_REL


def _converged(tried: list[_Tried], min_samples: int) -> bool:
    """Whether the last two attempts (both paused) agree within CONVERGED_REL, or within their noise.

    A GEMM that draws the power limit by itself stays flagged capped at any rest (a reading or
    two at the start of each paused attempt still shows the cap), and further retries move such
    GEMMs by less than their noise while costing a second each. The number is kept, flagged.
    """
    if len(tried) < 2:
        return False
    (a, _, pause_a), (b, _, pause_b) = tried[-2], tried[-1]
    # an unpaused attempt says nothing of what rest does; two capped unpaused retries of a µs call that
    # agree mean an earlier case's cap still holds, which the next, longer cooldown may let go
    if not (pause_a > 0 and pause_b > 0):
        return False
    # a cut-short attempt with a few samples says little; one that holds min_samples, or whose median
    # is known to 0.5% already, is as good as a full one here (a long GEMM's attempts hold about
    # min_samples calls either way, cut or not)
    if not (_known(a, min_samples) and _known(b, min_samples)):
        return False
    noise = sum(n for n in (a.summary.get("median_noise"), b.summary.get("median_noise"))
                if n is not None and math.isfinite(n))      # too few samples to know: no allowance
    return abs(b.latency_us / a.latency_us - 1) <= max(CONVERGED_REL, noise)


def measure_with_retries(timer: _Timer, fn: Callable[[], Any], telemetry: Telemetry,
                         settings: TimingSettings) -> Attempted:
    """The first attempt's failure is the case's; a retry's failure ends the retries and is
    recorded beside the attempts, which still choose the number (the kept one is still flagged
    capped): a capped measurement said so is worth more than none."""
    tried: list[_Tried] = []
    failed: list[dict[str, Any]] = []
    for attempt in range(1 + settings.throttle_retries):
        pause_s = _next_pause_s(settings, attempt, tried)
        last = attempt == settings.throttle_retries
        if attempt:
            time.sleep(settings.cooldown_s(attempt))
        try:
            with TelemetrySampler(telemetry, settings.telemetry_period_s, settings.capped_clock_fraction) as sampler:
                m = timer.measure(fn, pause_s=pause_s, give_up=None if last else sampler.capped_since)
        except Exception as err:
            if not tried:
                raise
            failed.append({"pause_s": pause_s, "error": f"{type(err).__name__}: {str(err).strip()[:300]}",
                           "kept": False})
            break
        tried.append((m, sampler.summary(since_s=m.details.window_start_s), _paused_s(m, pause_s)))
        # a cut-short attempt counts as capped even where one more reading after the cut brought its
        # window's share under the line: it was stopped for the cap and holds only a few samples
        if not (tried[-1][1]["capped"] or _cut_short(m)) or _converged(tried, settings.min_samples):
            break
    # an attempt cut short whose median is known counts as full here too: retries that converged on
    # such attempts must keep one of them, not an earlier, capped, unrested full one
    usable = [i for i, (m, _, _) in enumerate(tried) if _known(m, settings.min_samples)] or list(range(len(tried)))
    # a cut-short attempt was stopped for the cap even where a reading after the cut made its window read
    # uncapped: it is never the uncapped one
    pool = [i for i in usable if not (tried[i][1]["capped"] or _cut_short(tried[i][0]))] or usable
    kept = min(pool, key=lambda i: tried[i][0].latency_us)

    def converged_at(i: int) -> bool:
        return i == len(tried) - 1 and i >= 1 and bool(tried[i][1]["capped"]) and \
            _converged(tried[:i + 1], settings.min_samples)

    brief = [{"latency_us": m.latency_us, "pause_s": p, "capped": t["capped"], "converged": converged_at(i),
              "capping_reasons": t.get("capping_reasons", []), "sm_clock_mhz": t.get("sm_clock_mhz"),
              "power_w": t.get("power_w"), "stop_reason": m.stop_reason, "samples": len(m.samples_us),
              "kept": i == kept} for i, (m, t, p) in enumerate(tried)]
    return Attempted(tried[kept][0], tried[kept][1], brief + failed)
