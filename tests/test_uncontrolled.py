"""The one rule for conditions neither side controlled: a band widens the minimum effect, contention holds
`faster`/`slower` back, and the decision says what the numbers alone said and why it differs."""

from __future__ import annotations

from operatorx.uncontrolled import Uncontrolled, cpu_contention, decide


def _ratio_verdict(lo: float, hi: float):
    """A compare-like verdict of an interval of B/A against a band."""
    def within(band: float) -> str:
        if hi < 1 - band:
            return "faster"
        if lo > 1 + band:
            return "slower"
        if lo >= 1 - band and hi <= 1 + band:
            return "same"
        return "ambiguous"
    return within


SPREAD = Uncontrolled("placement", "placement spread A 12.0% over 3 placements", 0.12)


def test_a_difference_within_the_band_is_not_slower_and_says_why():
    d = decide(_ratio_verdict(1.04, 1.06), 0.02, [SPREAD], "ambiguous")
    assert (d.verdict, d.numbers_verdict) == ("same", "slower")
    assert d.why == "slower by the numbers alone, not called so: within the placement spread (±12.0%)"


def test_a_difference_beyond_the_band_is_still_found():
    d = decide(_ratio_verdict(1.15, 1.18), 0.02, [SPREAD], "ambiguous")
    assert d.verdict == "slower" and d.because == () and d.why is None


def test_a_band_below_the_min_effect_changes_nothing():
    small = Uncontrolled("placement", "placement spread 0.5%", 0.005)
    d = decide(_ratio_verdict(1.04, 1.06), 0.02, [small], "ambiguous")
    assert d.verdict == "slower" and d.why is None


def test_contention_holds_back_either_direction_but_keeps_same():
    held = decide(_ratio_verdict(0.85, 0.88), 0.02, [cpu_contention(["A", "B"])], "inconclusive")
    assert (held.verdict, held.numbers_verdict) == ("inconclusive", "faster")
    assert held.why == "faster by the numbers alone, not called so: under CPU contention"
    same = decide(_ratio_verdict(0.995, 1.004), 0.02, [cpu_contention(["B"])], "inconclusive")
    assert same.verdict == "same" and same.why is None


def test_every_condition_that_mattered_is_named():
    gap = Uncontrolled("launch_gap", "launch-gap levels differ", 0.072)
    d = decide(_ratio_verdict(1.04, 1.06), 0.02, [gap, cpu_contention(["A"]), SPREAD], "ambiguous")
    assert d.verdict == "same" and d.because == ("within the launch-gap level difference (±7.2%)",
                                                 "under CPU contention", "within the placement spread (±12.0%)")
