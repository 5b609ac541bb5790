"""The A/B statistic: the paired difference of batch values, its confidence interval, a verdict.

Batches of A and B are taken in alternating order, batch i of A next to batch i of B, so a
drift (clocks, load, another process) moves both: the pairs are compared, not two pools. The
interval is a percentile bootstrap of the median paired difference (no normality assumed;
batch values are skewed by preemption); a Wilcoxon signed-rank p-value is given beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Optional

import numpy as np

__all__ = ["Difference", "paired_difference", "min_pairs"]


def min_pairs(confidence: float) -> int:
    """Fewest pairs whose signs alone can reach `confidence` (a sign test: all n agree with
    probability 2 / 2**n under no difference); with fewer, no interval means what it says."""
    return int(np.ceil(np.log2(2.0 / (1.0 - confidence))))


@dataclass(frozen=True)
class Difference:
    a_us: float                 # median of A's batch values
    b_us: float
    diff_us: float              # median of (b_i - a_i): > 0 means B takes longer
    ci_low_us: float
    ci_high_us: float
    confidence: float
    rel_diff: float             # diff_us / a_us
    p_value: Optional[float]    # Wilcoxon signed-rank, two-sided; None when every pair is equal
    pairs: int
    verdict: str                # "faster", "slower", "same" or "inconclusive": B relative to A
    same_within_rel: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _ci(d: np.ndarray, confidence: float, seed: int) -> tuple[float, float]:
    if d.size < 3 or float(np.ptp(d)) == 0.0:
        return float(np.min(d)), float(np.max(d))
    import inspect

    from scipy.stats import bootstrap

    gen = np.random.default_rng(seed)
    seeded = {"rng": gen} if "rng" in inspect.signature(bootstrap).parameters else {"random_state": gen}  # <1.15
    res = bootstrap((d,), np.median, confidence_level=confidence, n_resamples=4000, method="percentile",
                    vectorized=True, axis=-1, **seeded)
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def _p_value(d: np.ndarray) -> Optional[float]:
    if not np.any(d):
        return None
    from scipy.stats import wilcoxon

    try:
        return float(wilcoxon(d).pvalue)
    except ValueError:
        return None


def paired_difference(a_us: Sequence[float], b_us: Sequence[float], confidence: float = 0.95,
                      same_within_rel: float = 0.01, seed: int = 0) -> Difference:
    """B against A from paired batch values (same length, batch i of each taken together).

    Verdict: `slower` when the whole interval lies above zero and the median difference exceeds
    `same_within_rel` of A's median (differences smaller than that are not worth a verdict);
    `faster` the mirror image; `same` when the whole interval lies within that band;
    `inconclusive` otherwise (the interval spans zero, or reaches past the band while the median
    stays inside it: too noisy to say — more batches, or a quieter machine), and always when there
    are fewer pairs than `min_pairs(confidence)`.
    """
    a, b = np.asarray(a_us, dtype=np.float64), np.asarray(b_us, dtype=np.float64)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"paired batches: {a.size} vs {b.size}")
    d = b - a
    diff = float(np.median(d))
    low, high = _ci(d, confidence, seed)
    a_med = float(np.median(a))
    threshold = same_within_rel * abs(a_med)
    if d.size < min_pairs(confidence):
        verdict = "inconclusive"
    elif low > 0 and diff > threshold:
        verdict = "slower"
    elif high < 0 and -diff > threshold:
        verdict = "faster"
    elif -threshold <= low and high <= threshold:
        verdict = "same"
    else:
        verdict = "inconclusive"
    return Difference(a_us=a_med, b_us=float(np.median(b)), diff_us=diff, ci_low_us=low, ci_high_us=high,
                      confidence=confidence, rel_diff=diff / a_med if a_med else float("nan"),
                      p_value=_p_value(d), pairs=int(d.size), verdict=verdict, same_within_rel=same_within_rel)
