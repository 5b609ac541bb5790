"""One table-driven summary for every timing strategy, and the noise the stopping rule reads."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Optional

import numpy as np

__all__ = ["median_noise", "preload", "summarize"]

_STATS = {
    "median": lambda x: np.median(x),
    "mean": lambda x: np.mean(x),
    "min": lambda x: np.min(x),
    "max": lambda x: np.max(x),
    "p10": lambda x: np.percentile(x, 10),
    "p90": lambda x: np.percentile(x, 90),
    "iqr": lambda x: np.percentile(x, 75) - np.percentile(x, 25),
    "std": lambda x: np.std(x, ddof=1) if len(x) > 1 else 0.0,
}


@lru_cache(maxsize=4096)
def _median_ci_ranks(n: int, confidence: float) -> Optional[tuple[int, int]]:
    """0-based order-statistic ranks (lo, hi) whose interval holds the median with >= `confidence`.

    Distribution-free: the number of samples below the true median is Binomial(n, 1/2), so
    [x(j), x(n-1-j)] covers it unless at least n-j fall on one side. With too few samples even
    the whole range covers it with less than `confidence` (n <= 5 at 95%: 1 - 2/2^n): then
    None, and the noise is unknown rather than the range's, which would claim more than it knows.

    j is the largest rank whose binomial CDF is <= (1 - confidence) / 2, read from SciPy's
    `special.bdtr` (what `stats.binom.cdf` computes): importing `scipy.stats` took ~0.6 s, and it
    happened inside a worker's first case, whose time cap it spent.
    """
    from scipy.special import bdtr

    tail = (1.0 - confidence) / 2
    ranks = np.arange(n // 2 + 1)
    within = np.nonzero(bdtr(ranks, n, 0.5) <= tail)[0]
    if within.size == 0:
        return None
    j = int(within[-1])
    return j, n - 1 - j


def preload() -> None:
    """Import what the stopping rule needs now (a worker's start-up), not in the first case's window."""
    _median_ci_ranks(8, 0.95)


def median_noise(samples_us: Sequence[float] | np.ndarray, confidence: float = 0.95) -> float:
    """Relative half-width of the median's distribution-free confidence interval (0.005 = ±0.5%);
    inf while there are too few samples for any such interval (n <= 5 at 95%)."""
    x = np.sort(np.asarray(samples_us, dtype=np.float64))
    if x.size < 2:
        return float("inf")
    median = float(np.median(x))
    if not median > 0:                      # also NaN: unknown, never a noise the stop rule could accept
        return float("inf")
    ranks = _median_ci_ranks(int(x.size), confidence)
    if ranks is None:
        return float("inf")
    lo, hi = ranks
    return float(x[hi] - x[lo]) / 2 / median


def summarize(samples_us: Sequence[float]) -> dict[str, float]:
    """Summary statistics in µs, plus `n`, the relative spread `cv` (std / mean) and
    `median_noise` (the median's relative 95% confidence half-width)."""
    x = np.asarray(samples_us, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no samples to summarize")
    out = {name: float(f(x)) for name, f in _STATS.items()}
    out["n"] = int(x.size)
    out["cv"] = out["std"] / out["mean"] if out["mean"] > 0 else 0.0
    out["median_noise"] = median_noise(x)
    return out
