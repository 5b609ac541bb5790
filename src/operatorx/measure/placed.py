"""One case timed at several operand placements, the placements' samples interleaved.

The same kernel on the same data can take several % longer at one device address than at another
(docs/benchmarks.md, "Where the operands lie"). So a case may be prepared N times, each copy at
other addresses (run/placements.py), and timed here: R rounds over the N copies in mirrored order
(0..N−1, then N−1..0), so that a clock drift over the case does not line up with one placement. Each
(round, placement) is one `measure_with_retries` attempt set with 1/R of the samples' budget; a
placement's samples are its rounds pooled, its number their median, and the case's number is the
median over placements: what another allocator's placement would most likely read.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Optional

from operatorx.measure.measurement import Measurement, R
from operatorx.measure.retry import Attempted, measure_with_retries
from operatorx.measure.settings import TimingSettings
from operatorx.measure.stats import summarize
from operatorx.measure.telemetry import Telemetry

__all__ = ["PLACEMENT_ROUNDS", "PlacedMeasurement", "PlacedResult", "measure_placed", "merge_telemetry",
           "round_order"]

PLACEMENT_ROUNDS = 2
"""Rounds over the placements: two in mirrored order cancel a linear drift (0,1,2,2,1,0)."""


@dataclass(frozen=True)
class PlacedMeasurement(Measurement[R]):
    """The placements' samples pooled; `latency_us` is the median over the placements' medians."""

    headline_us: float = math.nan

    @property
    def latency_us(self) -> float:
        return self.headline_us


@dataclass(frozen=True)
class PlacedResult:
    """What `measure_placed` measured: the kept attempts merged, and each placement's numbers."""

    attempted: Attempted
    per_placement_us: list[float]
    per_placement_busy_us: Optional[list[float]]
    rounds: int

    @property
    def spread_pct(self) -> float:
        """(slowest − fastest placement) / the headline × 100."""
        headline = self.attempted.measurement.latency_us
        return (max(self.per_placement_us) - min(self.per_placement_us)) / headline * 100 if headline > 0 else 0.0


def round_order(count: int, rounds: int) -> list[tuple[int, int]]:
    """(round, placement) in the order measured: even rounds forward, odd rounds backward."""
    out: list[tuple[int, int]] = []
    for r in range(rounds):
        placements = range(count) if r % 2 == 0 else range(count - 1, -1, -1)
        out.extend((r, p) for p in placements)
    return out


def _round_settings(settings: TimingSettings, rounds: int, first: bool) -> TimingSettings:
    """One round's share of the case's sampling budget; a placement's later rounds are warm already."""
    share = replace(settings, min_samples=max(1, math.ceil(settings.min_samples / rounds)),
                    max_samples=max(1, settings.max_samples // rounds),
                    noise_target=settings.noise_target * math.sqrt(rounds),
                    max_time_s=settings.max_time_s / rounds)
    if share.max_samples < share.min_samples:
        share = replace(share, max_samples=share.min_samples)
    if first:
        return share
    return replace(share, warmup_calls=1, warmup_floor_s=0.0, first_warmup_floor_s=0.0)


def _with_settings(timer: Any, settings: TimingSettings) -> Any:
    """The same timer (its flusher, clock, method) under other settings."""
    twin = copy.copy(timer)
    twin.settings = settings
    return twin


def _quantity(values: Sequence[Any]) -> Optional[dict[str, float]]:
    """min/p50/max readings of several windows: the lowest min, the median p50, the highest max."""
    parts = [v for v in values if isinstance(v, dict) and {"min", "p50", "max"} <= v.keys()]
    if not parts:
        return None
    return {"min": min(v["min"] for v in parts), "p50": statistics.median(v["p50"] for v in parts),
            "max": max(v["max"] for v in parts)}


def merge_telemetry(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One telemetry summary of several timed windows: capped when any was, reasons and readings
    added up, clock/power/temperature ranges over all of them, energy summed when every window has it."""
    if not parts:
        raise ValueError("no telemetry to merge")
    out = dict(parts[0])
    if not all(p.get("available", False) for p in parts):
        return {"available": False, "capped": any(bool(p.get("capped")) for p in parts)}
    out["capped"] = any(bool(p.get("capped")) for p in parts)
    for key in ("readings", "capped_readings", "readings_before_window", "failed_readings"):
        if any(key in p for p in parts):
            out[key] = sum(int(p.get(key) or 0) for p in parts)
    reasons: dict[str, int] = {}
    for p in parts:
        for name, n in (p.get("reasons") or {}).items():
            reasons[name] = reasons.get(name, 0) + int(n)
    out["reasons"] = reasons
    seen: list[str] = []
    for p in parts:
        seen.extend(r for r in p.get("capping_reasons") or [] if r not in seen)
    out["capping_reasons"] = seen
    for key in {k for p in parts for k, v in p.items() if isinstance(v, dict) and "p50" in v}:
        merged = _quantity([p.get(key) for p in parts])
        if merged is not None:
            out[key] = merged
    energies = [p.get("energy_mj") for p in parts]
    out["energy_mj"] = sum(energies) if all(isinstance(e, (int, float)) for e in energies) else None
    spans = [p.get("energy_s") for p in parts]
    out["energy_s"] = sum(spans) if all(isinstance(s, (int, float)) for s in spans) else None
    return out


def _busy(m: Measurement[Any]) -> tuple[Optional[float], Optional[list[float]]]:
    record = m.details
    return getattr(record, "busy_us_median", None), getattr(record, "busy_samples_us", None)


def measure_placed(timer: Any, fns: Sequence[Callable[[], Any]], telemetry: Telemetry,
                   settings: TimingSettings, rounds: int = PLACEMENT_ROUNDS) -> PlacedResult:
    """Time each of `fns` (one per placement) over `rounds` mirrored rounds; one placement is
    `measure_with_retries` itself (the same number, no rounds)."""
    if len(fns) == 1:
        done = measure_with_retries(timer, fns[0], telemetry, settings)
        busy, _ = _busy(done.measurement)
        return PlacedResult(done, [done.measurement.latency_us], [busy] if busy is not None else None, 1)
    shares = {first: _round_settings(settings, rounds, first) for first in (True, False)}
    timers = {first: _with_settings(timer, share) for first, share in shares.items()}
    got: dict[tuple[int, int], Attempted] = {}
    for r, p in round_order(len(fns), rounds):
        got[r, p] = measure_with_retries(timers[r == 0], fns[p], telemetry, shares[r == 0])
    per_us: list[float] = []
    per_busy: list[float] = []
    busy_known = True
    for p in range(len(fns)):
        mine = [got[r, p].measurement for r in range(rounds)]
        per_us.append(float(statistics.median([s for m in mine for s in m.samples_us])))
        busy_samples = [_busy(m)[1] for m in mine]
        if all(b for b in busy_samples):
            per_busy.append(float(statistics.median([b for bs in busy_samples for b in bs or []])))
        else:
            busy_known = False
    order = round_order(len(fns), rounds)
    pooled = [s for key in order for s in got[key].measurement.samples_us]
    first = got[0, 0].measurement
    record = first.details
    if busy_known and per_busy:
        record = record.model_copy(update={
            "busy_us_median": float(statistics.median(per_busy)),
            "busy_samples_us": [b for key in order for b in _busy(got[key].measurement)[1] or []]})
    stop_reasons = sorted({got[key].measurement.stop_reason for key in order})
    merged: PlacedMeasurement[Any] = PlacedMeasurement(
        method=first.method, clock=first.clock, samples_us=pooled, summary=summarize(pooled),
        warmup_calls=sum(got[key].measurement.warmup_calls for key in order),
        warmup_s=sum(got[key].measurement.warmup_s for key in order),
        stop_reason="+".join(stop_reasons), details=record, last_batch=first.last_batch,
        headline_us=float(statistics.median(per_us)))
    attempts = [{**a, "placement": p, "round": r} for r, p in order for a in got[r, p].attempts]
    telemetry_all = merge_telemetry([got[key].telemetry for key in order])
    return PlacedResult(Attempted(merged, telemetry_all, attempts), per_us,
                        per_busy if busy_known and per_busy else None, rounds)
