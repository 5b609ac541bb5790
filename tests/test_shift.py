"""One estimator for the point and its interval: hand-computed cases, the exact signed-rank ranks, and
planted samples (skewed, bimodal, tied) whose point must lie inside its interval on every path."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from operatorx import shift
from operatorx.report.compare import compare_samples
from operatorx.run.ab_stats import paired_difference
from operatorx.shift import hodges_lehmann, paired_hodges_lehmann, signed_rank_lower_rank


def test_a_hand_computed_two_sample_shift_and_interval():
    # y − x = 10 + (j − i) for i, j in 0..4: 6..14 with counts 1,2,3,4,5,4,3,2,1 (25 differences).
    # c = floor(25/2 − 1.96·sqrt(25·11/12)) = floor(12.5 − 9.38) = 3: the 3rd smallest (7) and 3rd largest (13).
    assert hodges_lehmann([0, 1, 2, 3, 4], [10, 11, 12, 13, 14]) == (10.0, 7.0, 13.0)


def test_a_hand_computed_ratio_on_log_times():
    a = [2.0 ** i for i in range(5)]
    b = [2.0 ** (i + 10) for i in range(5)]          # log differences: ln 2 × the 6..14 above
    ratio, lo, hi, _ = compare_samples(a, b)
    assert ratio == pytest.approx(1024) and lo == pytest.approx(128) and hi == pytest.approx(8192)


def test_a_hand_computed_paired_shift_and_interval():
    # d = 1..8: 36 Walsh averages (i + j)/2, symmetric about 4.5. For 8 pairs P(T+ <= 3) = 5/256 <= 0.025 <
    # P(T+ <= 4) = 7/256, so k = 4: the 4th smallest (1, 1.5, 2, 2 -> 2) and the 4th largest (7).
    assert signed_rank_lower_rank(8, 0.95) == 4
    assert paired_hodges_lehmann(range(1, 9)) == (4.5, 2.0, 7.0)


@pytest.mark.parametrize(("pairs", "k"), [(5, 0), (6, 1), (8, 4), (10, 9), (15, 26), (20, 53)])
def test_signed_rank_ranks_match_the_published_critical_values(pairs, k):
    """k − 1 is the two-sided 5% critical value of Wilcoxon's table (n=6: 0, 8: 3, 10: 8, 15: 25, 20: 52)."""
    assert signed_rank_lower_rank(pairs, 0.95) == k


def test_the_exact_signed_rank_distribution_matches_enumeration():
    n = 11
    sums = [sum(s) for r in range(n + 1) for s in itertools.combinations(range(1, n + 1), r)]
    counts = np.bincount(sums)
    cdf = np.cumsum(counts) / 2 ** n
    expected = int(np.nonzero(cdf <= 0.025)[0][-1]) + 1
    assert signed_rank_lower_rank(n, 0.95) == expected


def test_the_normal_approximation_continues_the_exact_ranks():
    exact = signed_rank_lower_rank(shift._EXACT_SIGNED_RANK_PAIRS, 0.95)
    approx = signed_rank_lower_rank(shift._EXACT_SIGNED_RANK_PAIRS + 1, 0.95)
    step = shift._EXACT_SIGNED_RANK_PAIRS + 1          # T+ grows by about n when n grows by one
    assert 0 < approx - exact < step


def _skewed(rng, n, center=20.0):
    """Lognormal with a heavy tail: 8% of calls 2-4x slower."""
    x = center * np.exp(rng.normal(0, 0.15, n))
    tail = rng.random(n) < 0.08
    x[tail] *= rng.uniform(2, 4, tail.sum())
    return x


def _bimodal(n_low, n_high, low=10.0, high=20.0):
    return np.array([low] * n_low + [high] * n_high)


def _tied(rng, n, center=10.0):
    """Few distinct values: times on a 0.1 µs grid, most of them equal."""
    return np.round(center + rng.choice([0.0, 0.0, 0.0, 0.1, 0.2, 1.0], n), 1)


PLANTED = {
    "skewed": lambda rng, n: (_skewed(rng, n), _skewed(rng, n) * 1.03),
    "bimodal": lambda rng, n: (_bimodal(n // 2 + 1, n - n // 2 - 1), _bimodal(n // 2 - 1, n - n // 2 + 1)),
    "tied": lambda rng, n: (_tied(rng, n), _tied(rng, n)),
}


@pytest.mark.parametrize("kind", sorted(PLANTED))
@pytest.mark.parametrize("n", [60, 400])            # 3,600 differences formed; 160,000 by bisection
def test_the_ratio_lies_inside_its_interval(kind, n, monkeypatch):
    rng = np.random.default_rng(7)
    for _ in range(5):
        a, b = PLANTED[kind](rng, n)
        ratio, lo, hi, _ = compare_samples(list(a), list(b))
        assert lo <= ratio <= hi, (kind, n, ratio, lo, hi)


def test_a_ratio_of_medians_falls_outside_the_interval_and_the_estimate_does_not():
    """The bug the estimator fixes: 51/49 against 49/51 of two modes. The medians are 10 and 20 (B/A 2.0);
    most pairwise ratios are 1, so the interval is [1, 1] and the old point lay far outside it."""
    a, b = _bimodal(51, 49), _bimodal(49, 51)
    ratio, lo, hi, _ = compare_samples(list(a), list(b))
    assert float(np.median(b) / np.median(a)) == 2.0 and not lo <= 2.0 <= hi
    assert (ratio, lo, hi) == (1.0, 1.0, 1.0)


@pytest.mark.parametrize("kind", sorted(PLANTED))
@pytest.mark.parametrize("pairs", [7, 15, 41, 250])
def test_the_paired_difference_lies_inside_its_interval(kind, pairs):
    rng = np.random.default_rng(11)
    for _ in range(5):
        a, b = PLANTED[kind](rng, pairs)
        rng.shuffle(b)
        d = paired_difference(a, b)
        assert d.ci_low_us <= d.diff_us <= d.ci_high_us, (kind, pairs, d)


def test_bisection_ends_on_a_difference_itself():
    rng = np.random.default_rng(3)
    x, y = np.sort(_tied(rng, 300)), np.sort(_tied(rng, 300))
    every = np.sort((y[:, None] - x[None, :]).ravel())
    for k in (1, 17, 45_000, 89_999, 90_000):
        assert shift._bisect_kth(x, y, k) == every[k - 1]
    assert math.isinf(hodges_lehmann([1.0, 2.0], [3.0, 4.0])[1])     # too few samples: unbounded
