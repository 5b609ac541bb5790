"""Everything `results compare` says about one pair of rows besides the numbers. That is three things:
the conditions neither run controlled, which the verdict accounts for (operatorx/uncontrolled.py);
what differs between the two rows; and every note the terminal table gives each row, in full. A flag
the table shows for a row is never dropped from its comparison.

The conditions, each read from the rows:
- **placement**: `metrics.placement` (`count`, `per_placement_us`, `spread_pct`) is a row measured at
  several operand placements. A difference within the two rows' spreads added may be the operands'
  addresses, not the op. A row without it, or with `count` 1, did not control placement, and the
  comparison says so.
- **launch gap**: a multi-kernel call timed by two workers at different launch-gap levels. Its span
  moves by about boundaries × the difference, whatever the op did (measure/launch_gap.py).
- **CPU contention**: a host-clock row whose samples lost the CPU (`timing.cpu_contended`,
  measure/cpu_contention.py). Two runs are timed at different times, under loads they need not
  share, so contention holds the verdict back even where the contended samples were dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from operatorx.report.table import row_notes
from operatorx.result import Headline, Row
from operatorx.result_parts import Placement
from operatorx.uncontrolled import Uncontrolled, cpu_contention

__all__ = ["placement_of", "PairConditions", "pair_conditions", "side_notes", "LAUNCH_GAP_STEP_US",
           "NOT_CONTROLLED"]

LAUNCH_GAP_STEP_US = 0.08     # two workers' launch-gap levels differ when further apart than this: on the H200
                              # one process's readings spread up to ~0.06 µs, two levels lie 0.1-0.2 apart
NOT_CONTROLLED = "placement not controlled"
"""How a comparison names rows measured at a single operand placement."""


def placement_of(row: Row) -> Optional[Placement]:
    """The row's placement record (`Row.placement`, from `--placements N`), or None when the row has
    none. Every reader of a row's placements goes through this."""
    return row.placement


def _controlled(placement: Optional[Placement]) -> bool:
    return placement is not None and placement.count >= 2


@dataclass(frozen=True)
class PairConditions:
    uncontrolled: list[Uncontrolled] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    """The uncontrolled conditions in words, then what differs between the rows, then each side's notes."""
    not_controlled: Optional[str] = None
    """`placement not controlled in A and B` (or in A, or in B) when a side had one placement."""


def _differs(what: str, a: Any, b: Any) -> Optional[str]:
    return f"{what} differ: {a} vs {b}" if a is not None and b is not None and a != b else None


def _placement(a: Row, b: Row) -> tuple[Optional[Uncontrolled], Optional[str]]:
    """The placement condition of the pair, and which sides did not control placement.

    The band is the two rows' spreads added: each row's median over its few placements can sit
    anywhere inside its own spread, so their difference can reach both (run/ab_placement.py takes
    the same band). Where one side was timed at one placement, the other's spread is still a part
    of what the difference may be, and the flag says the rest is unknown."""
    read = {"A": placement_of(a), "B": placement_of(b)}
    spreads = [(side, p) for side, p in read.items() if p is not None and _controlled(p)]
    loose = [side for side, p in read.items() if not _controlled(p)]
    missing = f"{NOT_CONTROLLED} in {' and '.join(loose)}" if loose else None
    if not spreads:
        return None, missing
    band = sum(p.spread_pct for _, p in spreads) / 100
    said = " + ".join(f"{side} {p.spread_pct:.1f}% over {p.count} placements" for side, p in spreads)
    return Uncontrolled("placement", f"placement spread {said}: a difference within {100 * band:.1f}% may be where "
                                     "the operands lie", band), missing


def _launch_gap_us(row: Row) -> Optional[float]:
    """The launch-gap level of the worker that timed the row (None: a row from before the probe, or
    one of a mode that does not read it)."""
    m = row.measured
    return m.timing.launch_gap_us if m is not None and m.timing is not None else None


def _kernel_boundaries(row: Row) -> Optional[int]:
    """Kernel boundaries inside one call (kernels per call − 1), from the row's kernel breakdown."""
    profile = row.ran.profile if row.ran is not None else None
    if profile is None or not profile.kernels:
        return None
    return max(0, round(profile.kernels_per_call) - 1)


def _launch_gap(a: Row, b: Row) -> Optional[Uncontrolled]:
    """A multi-kernel call timed by two workers whose launch-gap levels differ. Its span moves by about
    boundaries × the difference whatever the op did, and its busy time does not (measure/launch_gap.py).
    B's kernel count is used where it has one, A's otherwise. A graph replay has no launch gaps to carry."""
    gap_a, gap_b = _launch_gap_us(a), _launch_gap_us(b)
    if gap_a is None or gap_b is None or abs(gap_b - gap_a) <= LAUNCH_GAP_STEP_US:
        return None
    if any(r.measured is not None and "cuda_graph" in (r.measured.method or "") for r in (a, b)):
        return None
    boundaries = _kernel_boundaries(b)
    if boundaries is None:
        boundaries = _kernel_boundaries(a)
    if not boundaries:
        return None
    shift_us = boundaries * (gap_b - gap_a)
    a_us = a.latency_us
    band = abs(shift_us) / a_us if a_us else None
    return Uncontrolled("launch_gap", f"launch-gap levels differ: {gap_a:.2f} vs {gap_b:.2f} µs a kernel boundary; "
                                      f"over {boundaries} boundaries about {shift_us:+.1f} µs of span (busy time "
                                      "does not carry it)", band)


def _contention(a: Row, b: Row) -> Optional[Uncontrolled]:
    sides = [side for side, r in (("A", a), ("B", b))
             if r.measured is not None and r.measured.timing is not None and r.measured.timing.cpu_contended]
    return cpu_contention(sides, "other processes had the CPU while it was timed, at a load two runs need not "
                                 "share") if sides else None


def _differences(a: Row, b: Row) -> list[str]:
    ma, mb = a.measured, b.measured
    flags: list[Optional[str]] = []
    if ma is not None and mb is not None:
        flags += [_differs("timing methods", ma.method, mb.method), _differs("clocks", ma.clock, mb.clock),
                  _differs("L2 states", ma.l2_state, mb.l2_state)]
    wa, wb = a.worker, b.worker
    if wa is not None and wb is not None:
        flags.append(_differs("GPUs", wa.name, wb.name) or _differs("GPU UUIDs", wa.uuid, wb.uuid))
    flags.append(_differs("backends", a.backend, b.backend))
    return [f for f in flags if f]


def side_notes(a: Optional[Row], b: Optional[Row], headline: Headline = "span") -> list[str]:
    """Each side's notes from the terminal table (`row_notes`), whole: `A: ...`, `B: ...`, and
    `A and B: ...` for a note both rows carry."""
    notes = {side: row_notes(r, headline) if r is not None else [] for side, r in (("A", a), ("B", b))}
    both = [n for n in notes["A"] if n in notes["B"]]
    out = [f"A and B: {n}" for n in both]
    for side in ("A", "B"):
        out += [f"{side}: {n}" for n in notes[side] if n not in both]
    return out


def pair_conditions(a: Optional[Row], b: Optional[Row], metric: Headline = "span") -> PairConditions:
    """The pair's uncontrolled conditions, its flags and its placement control (see module doc).
    With a side missing only the other side's notes are given."""
    if a is None or b is None:
        return PairConditions(flags=side_notes(a, b, metric))
    placement, not_controlled = _placement(a, b)
    found = [placement, _launch_gap(a, b) if metric == "span" else None, _contention(a, b)]
    uncontrolled = [c for c in found if c is not None]
    return PairConditions(uncontrolled=uncontrolled,
                          flags=[c.text for c in uncontrolled] + _differences(a, b) + side_notes(a, b, metric),
                          not_controlled=not_controlled)
