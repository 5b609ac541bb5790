"""ab's paired difference: the Hodges–Lehmann point with its signed-rank interval (a hand-computed case),
and verdicts that conditions neither side controlled hold back."""

from __future__ import annotations

import numpy as np
import pytest

from operatorx.run.ab_stats import paired_difference
from operatorx.uncontrolled import Uncontrolled, cpu_contention


def test_a_hand_computed_paired_difference():
    a = [100.0] * 8
    b = [100.0 + d for d in range(1, 9)]            # d = 1..8: point 4.5, interval [2, 7] (tests/test_shift.py)
    d = paired_difference(a, b, same_within_rel=0.01)
    assert (d.diff_us, d.ci_low_us, d.ci_high_us) == (4.5, 2.0, 7.0)
    assert d.verdict == "slower" and d.estimate == "paired_hodges_lehmann" and d.pairs == 8
    assert d.rel_diff == pytest.approx(0.045) and d.numbers_verdict is None and d.verdict_why is None


def test_contention_holds_a_real_difference_back_and_says_so():
    rng = np.random.default_rng(0)
    a = 10 + rng.normal(0, 0.05, 31)
    b = a + 2.0 + rng.normal(0, 0.05, 31)
    assert paired_difference(a, b).verdict == "slower"
    held = paired_difference(a, b, conditions=[cpu_contention(["B"], "the number includes batches that waited")])
    assert (held.verdict, held.numbers_verdict) == ("inconclusive", "slower")
    assert held.verdict_why == "slower by the numbers alone, not called so: under CPU contention"
    assert held.conditions == [{"kind": "cpu_contention", "band_rel": None,
                                "text": "CPU contended in B: the number includes batches that waited"}]


def test_a_difference_within_the_placement_spreads_is_not_slower_and_one_beyond_is():
    rng = np.random.default_rng(1)
    a = 20 + rng.normal(0, 0.01, 15)
    spreads = [Uncontrolled("placement", "placement spreads A 1.5% + B 1.5%", 0.03)]
    within = paired_difference(a, a * 1.02 + rng.normal(0, 0.01, 15), conditions=spreads)
    assert within.verdict == "same" and within.numbers_verdict == "slower"
    assert within.verdict_why == "slower by the numbers alone, not called so: within the placement spread (±3.0%)"
    beyond = paired_difference(a, a * 1.06 + rng.normal(0, 0.01, 15), conditions=spreads)
    assert beyond.verdict == "slower" and beyond.verdict_why is None
