"""run/ab_placement.py: each side's per-placement medians from its rounds, the spread, the verdict band."""

from __future__ import annotations

import pytest

from operatorx.run.ab_placement import ab_placements
from operatorx.run.ab_stats import paired_difference


def test_per_placement_medians_and_the_band():
    # round i at placement i mod 3; A's placement 1 is 10% slower, B's placements agree within 1%
    a = [10.0, 11.0, 10.1, 10.0, 11.0, 10.1, 10.0, 11.0, 10.1]
    b = [10.0, 10.1, 10.05] * 3
    got = ab_placements({"a": a, "b": b}, {"a": 3, "b": 3}, 3)
    assert got.per_placement_us == {"a": [10.0, 11.0, 10.1], "b": [10.0, 10.1, 10.05]}
    assert got.spread_pct["a"] == pytest.approx(1.0 / 10.1 * 100)
    assert got.spread_pct["b"] == pytest.approx(0.1 / 10.05 * 100)
    (cond,) = got.conditions()
    assert cond.kind == "placement"
    assert cond.band_rel == pytest.approx((got.spread_pct["a"] + got.spread_pct["b"]) / 100)
    assert cond.text == "placement spreads A 9.9% + B 1.0% (over 3 and 3 placements)"
    assert got.to_json()["controlled"] is True


def test_one_placement_is_said_not_controlled():
    got = ab_placements({"a": [1.0] * 6, "b": [1.0] * 6}, {"a": 1, "b": 1}, 1)
    assert got.conditions() == [] and got.controlled is False
    assert got.to_json()["note"] == "placement not controlled: a side was timed at one placement only"


def test_identical_code_at_other_placements_is_not_called_faster():
    """Seen on the H200 (2048x256x7168, torch against py: F.linear): B read 1.4% faster with spreads
    of 0.9% and 1.0%: each side's three placements missed the other's; the added spreads cover it."""
    a = [15.6, 15.5, 15.45] * 5
    b = [x * 0.986 for x in [15.5, 15.45, 15.35] * 5]
    spread = ab_placements({"a": a, "b": b}, {"a": 3, "b": 3}, 3)
    assert max(spread.spread_pct.values()) * 1.2 < 1.42 < sum(spread.spread_pct.values())
    assert paired_difference(a, b, 0.95, 0.01).verdict == "faster"
    assert paired_difference(a, b, 0.95, 0.01, spread.conditions()).verdict != "faster"


def test_a_difference_inside_the_spread_is_not_called_faster():
    # B reads 3% faster on every round, but A's placements alone span 10%
    a = [10.0, 11.0, 10.5] * 5
    b = [x * 0.97 for x in a]
    spread = ab_placements({"a": a, "b": b}, {"a": 3, "b": 3}, 3)
    plain = paired_difference(a, b, 0.95, 0.01)
    held = paired_difference(a, b, 0.95, 0.01, spread.conditions())
    assert plain.verdict == "faster"
    assert held.verdict in ("same", "inconclusive") and held.verdict != "faster"
