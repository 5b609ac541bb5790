"""The A/B statistic: the paired difference of batch values, its confidence interval, a verdict.

Batches of A and B are taken in alternating order, batch i of A next to batch i of B, so a drift
(clocks, load, another process) moves both. The pairs are compared, not two pools. One estimator
gives the point and the interval, so the point always lies inside it (shift.py): the point is the
Hodges–Lehmann estimate of the paired differences d (the median of their Walsh averages; the
"paired median difference B−A"), and the interval is two order statistics of the same averages from
the Wilcoxon signed-rank distribution. No normality is assumed (batch values are skewed by
preemption), and the same batches always give the same interval. The Wilcoxon signed-rank p-value is
given beside it. Conditions the run did not control (CPU contention, the placement spread) hold a
verdict back as operatorx/uncontrolled.py says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import numpy as np

from operatorx.shift import paired_hodges_lehmann
from operatorx.uncontrolled import Uncontrolled, decide

__all__ = ["Difference", "paired_difference", "min_pairs"]


def min_pairs(confidence: float) -> int:
    """Fewest pairs whose signs alone can reach `confidence` (a sign test: all n agree with
    probability 2 / 2**n under no difference); with fewer, no interval means what it says."""
    return int(np.ceil(np.log2(2.0 / (1.0 - confidence))))


@dataclass(frozen=True)
class Difference:
    a_us: float                 # median of A's batch values
    b_us: float
    diff_us: float              # the paired median difference B−A (Hodges–Lehmann): > 0 means B takes longer
    ci_low_us: float            # its interval, from the same Walsh averages: ci_low_us <= diff_us <= ci_high_us
    ci_high_us: float
    confidence: float
    rel_diff: float             # diff_us / a_us
    p_value: Optional[float]    # Wilcoxon signed-rank, two-sided; None when every pair is equal
    pairs: int
    verdict: str                # "faster", "slower", "same" or "inconclusive": B relative to A
    same_within_rel: float
    estimate: str = "paired_hodges_lehmann"
    """What diff_us is: the median of the Walsh averages of the paired differences."""
    numbers_verdict: Optional[str] = None
    """The verdict of the numbers alone, set only where an uncontrolled condition changed it."""
    verdict_why: Optional[str] = None
    """Which conditions changed the verdict, in words."""
    conditions: list[dict[str, Any]] = field(default_factory=list)
    """The uncontrolled conditions of this clock (`Uncontrolled.to_json()`): kind, text, band_rel."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _p_value(d: np.ndarray) -> Optional[float]:
    if not np.any(d):
        return None
    from scipy.stats import wilcoxon

    try:
        return float(wilcoxon(d).pvalue)
    except ValueError:
        return None


def paired_difference(a_us: Sequence[float], b_us: Sequence[float], confidence: float = 0.95,
                      same_within_rel: float = 0.01, conditions: Sequence[Uncontrolled] = ()) -> Difference:
    """B against A from paired batch values (same length, batch i of each taken together).

    The verdict against a band of `same_within_rel` of A's median (a smaller difference is not
    worth a verdict):
    - `slower` when the whole interval lies above zero and the difference exceeds the band;
    - `faster`, the mirror image;
    - `same` when the whole interval lies within the band;
    - `inconclusive` otherwise: the interval spans zero, or it reaches past the band while the point
      stays inside it. Too noisy to say: take more batches, or use a quieter machine. It is also
      `inconclusive` whenever there are fewer pairs than `min_pairs(confidence)`.
    `conditions` (uncontrolled.py) widen the band or hold `faster`/`slower` back, and the result
    says which did.
    """
    a, b = np.asarray(a_us, dtype=np.float64), np.asarray(b_us, dtype=np.float64)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"paired batches: {a.size} vs {b.size}")
    d = b - a
    diff, low, high = paired_hodges_lehmann(d, confidence)
    a_med = float(np.median(a))

    def verdict_within(band_rel: float) -> str:
        threshold = band_rel * abs(a_med)
        if d.size < min_pairs(confidence):
            return "inconclusive"
        if low > 0 and diff > threshold:
            return "slower"
        if high < 0 and -diff > threshold:
            return "faster"
        if -threshold <= low and high <= threshold:
            return "same"
        return "inconclusive"

    decision = decide(verdict_within, same_within_rel, conditions, "inconclusive")
    return Difference(a_us=a_med, b_us=float(np.median(b)), diff_us=diff, ci_low_us=low, ci_high_us=high,
                      confidence=confidence, rel_diff=diff / a_med if a_med else float("nan"),
                      p_value=_p_value(d), pairs=int(d.size), verdict=decision.verdict,
                      same_within_rel=same_within_rel,
                      numbers_verdict=decision.numbers_verdict if decision.because else None,
                      verdict_why=decision.why, conditions=[c.to_json() for c in conditions])
