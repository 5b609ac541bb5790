"""How a verdict treats a condition the measurement did not control. `results compare` and `ab` share
this one rule.

Some conditions can move a number by themselves: where the operands lie, a worker's launch-gap
level, another process on the CPU. A difference such a condition could account for cannot be told
apart from a change in the op, so it is never called `faster` or `slower`:

- A condition with a size (`band_rel`: the placement spread, or the share of the span that a
  launch-gap level difference carries) widens the band the difference must leave. The verdict is
  taken against max(min effect, every band), so a difference inside the band reads `same` or
  inconclusive. A difference beyond the band is still found.
- A condition without a size (CPU contention: another process had the CPU, by an unknown amount)
  holds back `faster` and `slower` whatever the size. The verdict reads inconclusive, or
  `same` when the interval shows it.

The decision says which: `numbers_verdict` is the verdict of the numbers alone against the min
effect, and `because` lists the conditions that changed it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Optional

__all__ = ["Uncontrolled", "Decision", "decide", "cpu_contention"]

Kind = Literal["placement", "launch_gap", "cpu_contention"]


@dataclass(frozen=True)
class Uncontrolled:
    kind: Kind
    text: str
    """What the condition is and where, in words (it is shown in full beside the verdict)."""
    band_rel: Optional[float] = None
    """The largest difference, as a fraction of A, that the condition could cause by itself. None
    means unknown: the samples themselves are not clean."""

    def reason(self) -> str:
        """The condition in a few words, as a verdict names it: `within the placement spread (±12.0%)`."""
        if self.band_rel is None:
            return f"under {_NAMES[self.kind]}"
        return f"within {_NAMES[self.kind]} (±{100 * self.band_rel:.1f}%)"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "band_rel": self.band_rel}


_NAMES: dict[Kind, str] = {"placement": "the placement spread", "launch_gap": "the launch-gap level difference",
                           "cpu_contention": "CPU contention"}


@dataclass(frozen=True)
class Decision:
    verdict: str
    numbers_verdict: str
    """The verdict of the numbers alone, against the min effect."""
    because: tuple[str, ...] = ()
    """The conditions that changed the verdict. Empty when none did."""

    @property
    def why(self) -> Optional[str]:
        """`slower by the numbers alone, not called so: within the placement spread (±12.0%)`, or None
        when nothing changed the verdict."""
        if not self.because:
            return None
        return f"{self.numbers_verdict} by the numbers alone, not called so: {'; '.join(self.because)}"


def decide(verdict_within: Callable[[float], str], min_effect: float, conditions: Sequence[Uncontrolled],
           inconclusive: str) -> Decision:
    """The verdict under `conditions`. `verdict_within(band)` gives the numbers' verdict when differences
    within `band` (a fraction of A) do not count. `inconclusive` is the caller's word for "cannot tell"."""
    numbers = verdict_within(min_effect)
    band = max([min_effect, *(c.band_rel for c in conditions if c.band_rel is not None)])
    verdict = verdict_within(band) if band > min_effect else numbers
    if verdict in ("faster", "slower") and any(c.band_rel is None for c in conditions):
        verdict = inconclusive
    if verdict == numbers:
        return Decision(verdict=verdict, numbers_verdict=numbers)
    because = tuple(c.reason() for c in conditions if c.band_rel is None or c.band_rel > min_effect)
    return Decision(verdict=verdict, numbers_verdict=numbers, because=because)


def _sides(sides: Sequence[str]) -> str:
    return " and ".join(sides)


def cpu_contention(sides: Sequence[str], why: str = "the machine was busy (other processes had the CPU)"
                   ) -> Uncontrolled:
    """`sides` (e.g. ["A", "B"]) were timed while other processes took the CPU: no verdict either way."""
    return Uncontrolled("cpu_contention", f"CPU contended in {_sides(sides)}: {why}")
