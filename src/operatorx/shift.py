"""Hodges–Lehmann shifts: one estimator gives both the point and its interval, so the point always lies
inside the interval.

- Two samples (`hodges_lehmann`, used by `results compare` on log times): the point is the median of all
  pairwise differences y_j − x_i. The interval is two order statistics of the same differences, picked
  from the Mann–Whitney null distribution (Moses' interval).
- Paired (`paired_hodges_lehmann`, used by `ab` on batch pairs): the point is the median of the Walsh
  averages (d_i + d_j) / 2, i <= j, of the paired differences d. The interval is two order statistics of
  the same averages, picked from the Wilcoxon signed-rank null distribution.

Both need no normal distribution (GPU samples are skewed, with a tail of slow calls). Both resist that
tail, since they take medians and not means. Both are deterministic: the same data always give the same
interval, which a bootstrap does not. A point from one estimator beside an interval from another can
fall outside it: a ratio of medians printed beside a Hodges–Lehmann interval read `0.111 [0.112, 0.123]`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import lru_cache
from statistics import NormalDist

import numpy as np

__all__ = ["hodges_lehmann", "paired_hodges_lehmann", "signed_rank_lower_rank"]

_DIRECT_PAIRS = 20_000
"""Up to this many pairwise differences, form them all. Beyond that, select by bisection on the value."""
_EXACT_SIGNED_RANK_PAIRS = 200
"""Up to this many pairs, the signed-rank null distribution is computed exactly. Beyond that, the normal
approximation is used."""
_WINDOW_ENUMERATE = 4_000_000
"""The most differences enumerated once bisection has narrowed the window to its floor. A larger window
can only hold ties of one value, so its upper end is returned."""


def _count_at_most(x: np.ndarray, y: np.ndarray, t: float) -> int:
    """How many pairs have y[j] − x[i] <= t (x sorted): one binary search per y."""
    return int(np.sum(x.size - np.searchsorted(x, y - t, side="left")))


def _window(x: np.ndarray, y: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Every difference y[j] − x[i] with lo < y[j] − x[i] <= hi. It uses the same comparisons as
    `_count_at_most`, so it holds exactly count(hi) − count(lo) values."""
    start = np.searchsorted(x, y - hi, side="left")
    stop = np.searchsorted(x, y - lo, side="left")
    lengths = np.maximum(stop - start, 0)
    js = np.repeat(np.arange(y.size), lengths)
    offsets = np.arange(js.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return y[js] - x[start[js] + offsets]


def _bisect_kth(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """The k-th smallest (1-based) y − x for sorted x and y, found without forming all n·m differences.

    Bisection on the value narrows (lo, hi] until it holds k and few enough differences (each step counts
    with m binary searches). The window is then enumerated, so the answer is one of the differences
    itself: identical samples give exactly 0, not a bisection tolerance."""
    n, m = x.size, y.size
    lo, hi = float(y[0] - x[-1]), float(y[-1] - x[0])
    pad = 1e-9 * max(1.0, abs(lo), abs(hi))
    lo, hi = lo - pad, hi + pad                 # count(lo) = 0 and count(hi) = n·m, whatever the rounding
    c_lo, c_hi = _count_at_most(x, y, lo), _count_at_most(x, y, hi)
    target = 4 * (n + m)
    while c_hi - c_lo > target:
        mid = (lo + hi) / 2
        if not lo < mid < hi:                   # adjacent floats: the window holds one value
            break
        c = _count_at_most(x, y, mid)
        if c >= k:
            hi, c_hi = mid, c
        else:
            lo, c_lo = mid, c
    if c_hi - c_lo > _WINDOW_ENUMERATE:
        return hi
    values = np.sort(_window(x, y, lo, hi))
    return float(values[k - c_lo - 1])


def _kth_differences(x: np.ndarray, y: np.ndarray, ks: list[int]) -> list[float]:
    """The k-th smallest (1-based) of all y[j] − x[i] for each k, for sorted x and y."""
    n, m = x.size, y.size
    if not ks:
        return []
    if n * m <= _DIRECT_PAIRS:
        d = np.partition((y[:, None] - x[None, :]).ravel(), [k - 1 for k in ks])
        return [float(d[k - 1]) for k in ks]
    return [_bisect_kth(x, y, k) for k in ks]


def hodges_lehmann(x: Iterable[float], y: Iterable[float], confidence: float = 0.95, estimate: bool = True
                   ) -> tuple[float, float, float]:
    """(shift, low, high) of y against x.

    The shift is the median of all pairwise differences y − x. The interval is the c-th smallest and
    the c-th largest of those differences. c comes from the Mann–Whitney null distribution, by the normal
    approximation, which is close from 10 samples a side. With too few samples c < 1 and the interval
    is unbounded (±inf). Since c lies below the middle, low <= shift <= high. `estimate=False` skips
    the shift (NaN) when only the interval is wanted."""
    xs, ys = np.sort(np.asarray(list(x), dtype=float)), np.sort(np.asarray(list(y), dtype=float))
    n, m = xs.size, ys.size
    if n == 0 or m == 0:
        raise ValueError("both sides need samples")
    total = n * m
    middle = ([(total + 1) // 2] if total % 2 else [total // 2, total // 2 + 1]) if estimate else []
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    c = int(math.floor(total / 2 - z * math.sqrt(total * (n + m + 1) / 12)))
    bounds = [c, total + 1 - c] if c >= 1 else []
    values = _kth_differences(xs, ys, middle + bounds)
    shift = sum(values[:len(middle)]) / len(middle) if middle else math.nan
    if not bounds:
        return shift, -math.inf, math.inf
    return shift, values[-2], values[-1]


@lru_cache(maxsize=1024)
def signed_rank_lower_rank(pairs: int, confidence: float) -> int:
    """k such that the k-th smallest and the k-th largest Walsh average of `pairs` paired differences
    bound a `confidence` interval of their median (0: too few pairs for any).

    k − 1 is the largest t with P(T+ <= t) <= (1 − confidence) / 2 under no shift (T+ is the Wilcoxon
    signed-rank statistic). It is exact up to _EXACT_SIGNED_RANK_PAIRS pairs: P(T+ = t) is the share of
    subsets of the ranks 1..n that sum to t. Beyond that the normal approximation is used."""
    if pairs < 1:
        return 0
    tail = (1.0 - confidence) / 2
    if pairs > _EXACT_SIGNED_RANK_PAIRS:
        total = pairs * (pairs + 1) / 2
        sd = math.sqrt(pairs * (pairs + 1) * (2 * pairs + 1) / 24)
        return max(0, int(math.floor(total / 2 - NormalDist().inv_cdf(1 - tail) * sd + 0.5)))
    p = np.zeros(pairs * (pairs + 1) // 2 + 1)
    p[0] = 1.0
    for rank in range(1, pairs + 1):                 # each rank is in the positive set or not, half each
        shifted = np.zeros_like(p)
        shifted[rank:] = p[:-rank]
        p = (p + shifted) / 2
    below = np.nonzero(np.cumsum(p) <= tail * (1 + 1e-12))[0]
    return int(below[-1]) + 1 if below.size else 0


def paired_hodges_lehmann(d: Iterable[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(shift, low, high) of paired differences d: the median of their Walsh averages and the k-th
    smallest and largest of them (`signed_rank_lower_rank`). With too few pairs for an interval (k = 0:
    under 6 at 95%), the whole range of the averages is returned, which covers the shift with less than
    `confidence`, and callers give no verdict then (run/ab_stats.py: `min_pairs`)."""
    ds = np.sort(np.asarray(list(d), dtype=float))
    n = ds.size
    if n == 0:
        raise ValueError("paired differences: none")
    i, j = np.triu_indices(n)
    walsh = np.sort((ds[i] + ds[j]) / 2)
    total = walsh.size
    shift = float(walsh[total // 2]) if total % 2 else float((walsh[total // 2 - 1] + walsh[total // 2]) / 2)
    k = signed_rank_lower_rank(n, confidence)
    if k < 1:
        return shift, float(walsh[0]), float(walsh[-1])
    return shift, float(walsh[k - 1]), float(walsh[total - k])
