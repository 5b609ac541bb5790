"""Regression verdicts: is B faster or slower than A, per case, and how sure are we?

For each case present in both documents (matched by case key and side), from the raw samples:

- **ratio** = median(B) / median(A): the number a reader wants.
- **confidence interval** of the ratio: the Hodges–Lehmann shift of log(B) against log(A) with the
  Mann–Whitney (Moses) interval, exponentiated. Distribution-free (GPU samples are skewed, with a
  tail of slow calls; no normality is assumed), robust to those tails (a median of pairwise
  differences, not a mean), on log times so the shift is a ratio, and exact order statistics of the
  pairwise differences rather than resampling: the same data always give the same interval, and
  2,000 × 2,000 samples cost milliseconds (the k-th pairwise difference is found by bisection on
  its value with sorted counting, never materialising the 4 M differences). A bootstrap would
  need thousands of resamples per case for a stable 95% tail and still differ run to run.
- **p-value**: two-sided Mann–Whitney U of the two sample sets; **q-value**: Benjamini–Hochberg
  across the compared cases, so a sweep of 1,000 cases at alpha 0.05 does not report ~50 changes
  out of pure noise (the false discovery rate among the `faster`/`slower` verdicts stays at alpha).
- **verdict** against the minimum effect e (`--min-effect`, default 0.02):
  `slower` when the whole interval lies above 1 + e and q < alpha; `faster` when it lies below
  1 − e and q < alpha; `same` when the whole interval lies inside [1 − e, 1 + e] (an equivalence
  claim, not merely "no significant difference"); `ambiguous` otherwise (too noisy to say either);
  `missing` when either side has no `ok` row with samples.

How this compares with the two usual tools:
- NVBench's `nvbench_compare.py` compares means and calls a case SAME when |diff| <= the smaller
  relative standard deviation of the two, else FAST/SLOW: no test, no interval, no multiple-testing
  control, and on µs kernels with 0.2% noise a 0.3% wobble between runs is reported SLOW (its
  `--threshold-diff` only hides rows from the table; it does not change the status).
- Google Benchmark's `compare.py` runs a two-sided Mann–Whitney U on repetitions at alpha 0.05 per
  benchmark: a p-value without an effect size (with thousands of samples any 0.1% shift is
  "significant"), no correction across benchmarks, and no way to say "the same".
- Here a change must be both real (q < alpha after FDR control) and large enough to matter (the
  whole interval beyond the minimum effect), and "same" is a claim the interval has to earn.
  Samples of one run are not independent (clocks drift, batches sit differently), so the interval
  describes the spread inside a run; the minimum effect is the guard against run-to-run drift, and
  should sit above the run-to-run noise measured for the timer (docs/benchmarks.md).

Conditions that make the numbers less comparable are flagged, never hidden: per case (capped clocks,
L2 state not verified or different, timing method or clock different, ncu-perturbed, other GPU or
backend for the row, a multi-kernel call timed by workers of different launch-gap levels), and per
comparison (GPU, driver, software versions, timing settings).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any, Literal, Optional

import numpy as np

from operatorx.result import Headline, Row

__all__ = ["CaseComparison", "Comparison", "Verdict", "compare_documents", "compare_samples", "hodges_lehmann",
           "benjamini_hochberg", "mann_whitney_p"]

Verdict = Literal["faster", "slower", "same", "ambiguous", "missing"]
_DIRECT_PAIRS = 20_000        # up to this many pairwise differences: form them; beyond: bisection
LAUNCH_GAP_STEP_US = 0.08     # two workers' launch-gap levels differ when further apart than this: on the H200
                              # one process's readings spread up to ~0.06 µs, two levels lie 0.1-0.2 apart (§21)


@dataclass(frozen=True)
class CaseComparison:
    case_key: str
    label: str
    a_latency_us: Optional[float]
    b_latency_us: Optional[float]
    ratio: Optional[float]
    """median(B) / median(A): above 1 is slower."""
    ci_low: Optional[float]
    ci_high: Optional[float]
    p_value: Optional[float]
    q_value: Optional[float]
    verdict: Verdict
    flags: list[str] = field(default_factory=list)
    side: str = ""
    a_samples: int = 0
    b_samples: int = 0
    backend_a: Optional[str] = None
    backend_b: Optional[str] = None
    case_index_a: Optional[int] = None
    case_index_b: Optional[int] = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Comparison:
    a: str
    b: str
    min_effect: float
    alpha: float
    metric: Headline
    cases: list[CaseComparison]
    flags: list[str] = field(default_factory=list)
    """Conditions that differ between the two runs as a whole (GPU, driver, software, settings)."""

    def counts(self) -> dict[str, int]:
        out = {v: 0 for v in ("faster", "slower", "same", "ambiguous", "missing")}
        for c in self.cases:
            out[c.verdict] += 1
        return out

    @property
    def regressions(self) -> list[CaseComparison]:
        return [c for c in self.cases if c.verdict == "slower"]

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "min_effect": self.min_effect, "alpha": self.alpha, "metric": self.metric,
                "flags": list(self.flags), "counts": self.counts(), "cases": [c.to_json() for c in self.cases]}


# --- statistics -----------------------------------------------------------------------------------

def _kth_differences(x: np.ndarray, y: np.ndarray, ks: list[int]) -> list[float]:
    """The k-th smallest (1-based) of all y[j] − x[i] for each k, for sorted x and y."""
    n, m = x.size, y.size
    if not ks:
        return []
    if n * m <= _DIRECT_PAIRS:
        d = np.partition((y[:, None] - x[None, :]).ravel(), [k - 1 for k in ks])
        return [float(d[k - 1]) for k in ks]
    return [_bisect_kth(x, y, k) for k in ks]


def _bisect_kth(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """The k-th smallest difference by bisection on its value: count the pairs with y − x <= t
    from the sorted arrays (m binary searches) instead of forming all n·m differences."""
    n = x.size
    lo, hi = float(y[0] - x[-1]), float(y[-1] - x[0])
    tol = 1e-10 * max(1.0, abs(lo), abs(hi))       # on log times: a ratio to 1e-10, far below any noise
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi:
            break
        if int(np.sum(n - np.searchsorted(x, y - mid, side="left"))) >= k:
            hi = mid
        else:
            lo = mid
    return hi


def hodges_lehmann(x: Iterable[float], y: Iterable[float], confidence: float = 0.95, estimate: bool = True
                   ) -> tuple[float, float, float]:
    """(shift, low, high) of y against x: the median of all pairwise differences y − x, and the
    distribution-free interval from the Mann–Whitney null distribution (normal approximation, which
    is close from 10 samples a side; below that the interval may come out unbounded: ±inf).
    `estimate=False` skips the shift (NaN) when only the interval is wanted."""
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


def benjamini_hochberg(p_values: list[Optional[float]]) -> list[Optional[float]]:
    """q-values (BH step-up adjusted p-values) in the same order; None stays None."""
    present = [(p, i) for i, p in enumerate(p_values) if p is not None]
    out: list[Optional[float]] = [None] * len(p_values)
    m = len(present)
    running = 1.0
    for rank, (p, i) in reversed(list(enumerate(sorted(present), start=1))):
        running = min(running, p * m / rank)
        out[i] = min(1.0, running)
    return out


def mann_whitney_p(x: np.ndarray, y: np.ndarray) -> float:
    """Two-sided Mann–Whitney U p-value: normal approximation with tie and continuity corrections
    (what scipy's `mannwhitneyu(method="asymptotic")` gives; our samples number 10 to 2,000 a side)."""
    n, m = x.size, y.size
    values, inverse, counts = np.unique(np.concatenate([x, y]), return_inverse=True, return_counts=True)
    first_rank = np.cumsum(counts) - counts + 1
    ranks = (first_rank + (counts - 1) / 2.0)[inverse]          # average rank of each tie group
    u = float(ranks[:n].sum()) - n * (n + 1) / 2
    total = n + m
    tie_term = float(np.sum(counts.astype(float) ** 3 - counts)) / (total * (total - 1)) if total > 1 else 0.0
    var = n * m / 12.0 * ((total + 1) - tie_term)
    if not var > 0:
        return 1.0                                  # every sample equal: no evidence of any shift
    z = (abs(u - n * m / 2.0) - 0.5) / math.sqrt(var)
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


def compare_samples(a_us: list[float], b_us: list[float], confidence: float = 0.95
                    ) -> tuple[float, float, float, float]:
    """(ratio of medians B/A, CI low, CI high, Mann–Whitney p) of two sample sets (µs, all > 0); the
    interval is NaN when the samples are too few for one."""
    a, b = np.asarray(a_us, dtype=float), np.asarray(b_us, dtype=float)
    if not (np.all(a > 0) and np.all(b > 0)):
        raise ValueError("samples must be positive times")
    la, lb = np.log(a), np.log(b)
    _, lo, hi = hodges_lehmann(la, lb, confidence, estimate=False)
    ratio = float(np.median(b) / np.median(a))
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return ratio, math.nan, math.nan, mann_whitney_p(la, lb)
    return ratio, math.exp(lo), math.exp(hi), mann_whitney_p(la, lb)


def _verdict(lo: float, hi: float, q: float, min_effect: float, alpha: float) -> Verdict:
    """NaN bounds (no interval) compare false everywhere: `ambiguous`."""
    if hi < 1 - min_effect and q < alpha:
        return "faster"
    if lo > 1 + min_effect and q < alpha:
        return "slower"
    if lo >= 1 - min_effect and hi <= 1 + min_effect:
        return "same"
    return "ambiguous"


# --- conditions -----------------------------------------------------------------------------------

def _differs(what: str, a: Any, b: Any) -> Optional[str]:
    return f"{what} differ: {a} vs {b}" if a is not None and b is not None and a != b else None


def _run_flags(run_a: dict[str, Any], run_b: dict[str, Any], metric: Headline = "span") -> list[str]:
    dev_a, dev_b = run_a.get("device") or {}, run_b.get("device") or {}
    flags = [_differs("GPUs", dev_a.get("name"), dev_b.get("name")),
             _differs("drivers", run_a.get("driver") or dev_a.get("driver"),
                      run_b.get("driver") or dev_b.get("driver"))]
    sw_a, sw_b = run_a.get("software") or {}, run_b.get("software") or {}
    changed = [f"{k} {sw_a[k]} vs {sw_b[k]}" for k in sorted(set(sw_a) & set(sw_b)) if sw_a[k] != sw_b[k]]
    changed += [f"{k} only in {'A' if k in sw_a else 'B'}" for k in sorted(set(sw_a) ^ set(sw_b))]
    if changed:
        flags.append("software differs: " + ", ".join(changed))
    t_a, t_b = run_a.get("timing") or {}, run_b.get("timing") or {}
    for key in ("mode", "l2_state", "noise_target"):
        flags.append(_differs(f"timing {key}s", t_a.get(key), t_b.get(key)))
    if metric == "span":
        flags.append(_run_launch_gap_flag(run_a, run_b))
    return [f for f in flags if f]


def _run_readings(run: dict[str, Any]) -> list[float]:
    """The launch-gap readings of a run's workers (each worker slot's, else the run's first worker's);
    none from a record this version cannot read."""
    workers = run.get("workers")
    infos = [w.get("launch_gap") for w in workers.values() if isinstance(w, dict)] \
        if isinstance(workers, dict) else []
    infos = infos or [run.get("launch_gap")]
    try:
        return sorted(float(i["gap_us"]) for i in infos if isinstance(i, dict) and i.get("gap_us") is not None)
    except (TypeError, ValueError):
        return []


def _launch_gap_levels(readings: list[float]) -> list[list[float]]:
    """Sorted readings grouped into levels: a reading further than LAUNCH_GAP_STEP_US from the one
    before it starts a new level (eight workers of one host read two levels, not eight)."""
    levels: list[list[float]] = []
    for r in sorted(readings):
        if levels and r - levels[-1][-1] <= LAUNCH_GAP_STEP_US:
            levels[-1].append(r)
        else:
            levels.append([r])
    return levels


def _run_launch_gap_flag(run_a: dict[str, Any], run_b: dict[str, Any]) -> Optional[str]:
    """The two runs' workers had different sets of launch-gap levels: multi-kernel spans move with it.
    A run whose workers sat at two levels against one whose workers did too is not flagged here: which
    worker timed which case decides it, and the per-case flag says so."""
    a, b = _launch_gap_levels(_run_readings(run_a)), _launch_gap_levels(_run_readings(run_b))
    if not a or not b:
        return None

    def matched(level: list[float], others: list[list[float]]) -> bool:
        mean = sum(level) / len(level)
        return any(abs(mean - sum(o) / len(o)) <= LAUNCH_GAP_STEP_US for o in others)

    if all(matched(x, b) for x in a) and all(matched(y, a) for y in b):
        return None

    def said(levels: list[list[float]]) -> str:
        return " and ".join(f"{v[0]:.2f}" if v[-1] - v[0] < 0.005 else f"{v[0]:.2f}-{v[-1]:.2f}" for v in levels)

    return (f"launch-gap levels differ: {said(a)} vs {said(b)} µs a kernel boundary (multi-kernel spans "
            f"carry it, busy times do not: --metric busy compares without it)")


def _row_flags(a: Row, b: Row, metric: Headline = "span") -> list[str]:
    flags: list[Optional[str]] = []
    for side, row in (("A", a), ("B", b)):
        m = row.measured
        if row.conditions is not None and row.conditions.capped:
            flags.append(f"clock capped in {side}")
        if m is not None and m.l2_verified is False:
            flags.append(f"L2 state not verified in {side}")
        if row.ran is not None and row.ran.perturbed:
            flags.append(f"perturbed by ncu in {side}")
        if m is not None and m.timing is not None and m.timing.host_gaps_included:
            flags.append(f"host gaps included in {side}")
    ma, mb = a.measured, b.measured
    if ma is not None and mb is not None:
        flags += [_differs("timing methods", ma.method, mb.method), _differs("clocks", ma.clock, mb.clock),
                  _differs("L2 states", ma.l2_state, mb.l2_state)]
    if metric == "span":
        flags.append(_launch_gap_flag(a, b))
    wa, wb = a.worker, b.worker
    if wa is not None and wb is not None:
        flags.append(_differs("GPUs", wa.name, wb.name) or _differs("GPU UUIDs", wa.uuid, wb.uuid))
    flags.append(_differs("backends", a.backend, b.backend))
    return [f for f in flags if f]


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


def _launch_gap_flag(a: Row, b: Row) -> Optional[str]:
    """A multi-kernel call timed by two workers whose launch-gap levels differ: its span moves by about
    boundaries × the difference whatever the op did, and its busy time does not (measure/launch_gap.py).
    B's kernel count where it has one (A's otherwise); a graph replay has no launch gaps to carry."""
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
    return (f"launch-gap levels differ: {gap_a:.2f} vs {gap_b:.2f} µs a kernel boundary; over {boundaries} "
            f"boundaries about {shift_us:+.1f} µs of span (busy time does not carry it)")


# --- documents ------------------------------------------------------------------------------------

def _samples(row: Optional[Row], metric: Headline) -> list[float]:
    if row is None or row.status != "ok" or row.measured is None:
        return []
    if metric == "busy":
        return list(row.measured.busy_samples_us or [])
    return list(row.measured.samples_us)


def _index(doc: dict[str, Any]) -> dict[tuple[str, str, str], Row]:
    """Rows by (case key, side, backend-if-needed): a document holding one backend per case is matched
    by case alone, so two runs of different backends or versions compare case by case."""
    rows = [Row.from_json(r) for r in doc.get("rows") or []]
    per_case: dict[tuple[str, str], set[str]] = {}
    for r in rows:
        per_case.setdefault((r.compare_key(), r.side), set()).add(r.backend)
    out: dict[tuple[str, str, str], Row] = {}
    for r in rows:
        key = (r.compare_key(), r.side)
        out[(key[0], key[1], r.backend if len(per_case[key]) > 1 else "")] = r
    return out


def compare_documents(doc_a: dict[str, Any], doc_b: dict[str, Any], *, min_effect: float = 0.02,
                      alpha: float = 0.05, metric: Headline = "span") -> Comparison:
    """Per case of the two result documents (`Store.document`): B against A. `metric="busy"` compares
    per-call busy times where both rows carry them (else the case is `missing`)."""
    if not 0 <= min_effect < 1:
        raise ValueError(f"min_effect must be in [0, 1), got {min_effect}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    rows_a, rows_b = _index(doc_a), _index(doc_b)
    keys = list(rows_a) + [k for k in rows_b if k not in rows_a]
    stats: list[Optional[tuple[float, float, float, float]]] = []
    for key in keys:
        sa, sb = _samples(rows_a.get(key), metric), _samples(rows_b.get(key), metric)
        stats.append(compare_samples(sa, sb, 1 - alpha) if _usable(sa) and _usable(sb) else None)
    qs = benjamini_hochberg([s[3] if s else None for s in stats])
    cases = []
    for key, s, q in zip(keys, stats, qs, strict=True):
        a, b = rows_a.get(key), rows_b.get(key)
        some = a or b
        assert some is not None
        sa, sb = _samples(a, metric), _samples(b, metric)
        flags = _row_flags(a, b, metric) if a is not None and b is not None else []
        if s is None or q is None:
            why = [f"no ok row with {metric} samples in {side}" if len(x) < 2 else f"a sample <= 0 µs in {side}"
                   for side, x in (("A", sa), ("B", sb)) if not _usable(x)]
            verdict: Verdict = "missing"
            ratio = lo = hi = p = None
            flags = why + flags
        else:
            ratio, lo, hi, p = s
            verdict = _verdict(lo, hi, q, min_effect, alpha)
            if not (math.isfinite(lo) and math.isfinite(hi)):
                flags.insert(0, "too few samples for an interval")
        cases.append(CaseComparison(
            case_key=some.case.key(), label=some.label(), side=key[1],
            a_latency_us=float(np.median(sa)) if sa else None, b_latency_us=float(np.median(sb)) if sb else None,
            ratio=ratio, ci_low=_finite(lo), ci_high=_finite(hi), p_value=p, q_value=q if s else None,
            verdict=verdict, flags=flags, a_samples=len(sa), b_samples=len(sb),
            backend_a=a.backend if a else None, backend_b=b.backend if b else None,
            case_index_a=a.case_index if a else None, case_index_b=b.case_index if b else None))
    run_a, run_b = doc_a.get("run") or {}, doc_b.get("run") or {}
    return Comparison(a=str(run_a.get("id", "A")), b=str(run_b.get("id", "B")), min_effect=min_effect, alpha=alpha,
                      metric=metric, cases=cases, flags=_run_flags(run_a, run_b, metric))


def _usable(samples: list[float]) -> bool:
    """At least two samples, all positive times (a ratio of logs needs them)."""
    return len(samples) >= 2 and min(samples) > 0


def _finite(v: Optional[float]) -> Optional[float]:
    return v if v is not None and math.isfinite(v) else None
