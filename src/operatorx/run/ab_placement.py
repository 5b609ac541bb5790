"""An A/B's placements: each side's copies, their medians over the device rounds, and the spread a
verdict must leave before it calls one side faster.

Round i of `ab` times placement i mod N of each side, so a placement's number is the median of its
rounds' medians. The spread (slowest − fastest placement, over the median) is how much where the
operands lie moves that side by itself; a difference between A and B inside the two sides' spreads
added could be placement alone (uncontrolled.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from operatorx.uncontrolled import Uncontrolled

__all__ = ["ABPlacement", "ab_placements"]


@dataclass(frozen=True)
class ABPlacement:
    requested: int
    count: dict[str, int]
    per_placement_us: dict[str, list[float]]
    spread_pct: dict[str, float]
    fewer_why: dict[str, str] = field(default_factory=dict)

    @property
    def controlled(self) -> bool:
        """Every side was timed at more than one placement."""
        return all(n > 1 for n in self.count.values())

    def conditions(self) -> list[Uncontrolled]:
        """The placement spreads as a verdict's band: A's and B's added, since each side's median
        over its few placements can sit anywhere inside its own spread, and their difference up to
        both (none when a side had only one placement: then nothing is known of it, and `to_json`
        says placement was not controlled)."""
        if not self.controlled:
            return []
        band_pct = sum(self.spread_pct.values())
        text = (f"placement spreads {' + '.join(f'{s.upper()} {p:.1f}%' for s, p in self.spread_pct.items())} "
                f"(over {' and '.join(str(n) for n in self.count.values())} placements)")
        return [Uncontrolled("placement", text, band_rel=band_pct / 100)]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"requested": self.requested, "count": self.count,
                               "per_placement_us": self.per_placement_us, "spread_pct": self.spread_pct,
                               "controlled": self.controlled}
        if self.fewer_why:
            out["fewer_why"] = self.fewer_why
        if not self.controlled:
            out["note"] = "placement not controlled: a side was timed at one placement only"
        return out


def _spread_pct(values: Sequence[float]) -> float:
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid * 100 if mid > 0 else 0.0


def ab_placements(round_medians_us: Mapping[str, Sequence[float]], counts: Mapping[str, int], requested: int,
                  fewer_why: Optional[Mapping[str, str]] = None) -> ABPlacement:
    """Each side's per-placement medians from its round medians (round i at placement i mod count)."""
    per: dict[str, list[float]] = {}
    for side, medians in round_medians_us.items():
        n = counts[side]
        per[side] = [float(statistics.median(medians[p::n])) for p in range(n) if medians[p::n]]
    return ABPlacement(requested=requested, count=dict(counts), per_placement_us=per,
                       spread_pct={side: _spread_pct(v) for side, v in per.items()}, fewer_why=dict(fewer_why or {}))
