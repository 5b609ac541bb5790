"""Regression verdicts: is B faster or slower than A, per case, and how sure are we?

For each case present in both documents (matched by case key and side), from the raw samples:

- **ratio** B/A: the Hodges–Lehmann shift of log(B) against log(A), exponentiated. That is the median
  of all pairwise ratios b_j / a_i: the number a reader wants, robust to the tail of slow calls.
- **confidence interval** of the ratio: the Mann–Whitney (Moses) interval of the same shift, two
  order statistics of the same pairwise differences (operatorx/shift.py). Point and interval come
  from one estimator, so the ratio always lies inside its interval. A ratio of medians beside this
  interval once read `0.111 [0.112, 0.123]`. The interval needs no normal distribution (GPU samples
  are skewed), works on log times so the shift is a ratio, and uses exact order statistics rather
  than resampling. The same data always give the same interval, and 2,000 × 2,000 samples cost
  milliseconds. A bootstrap would need thousands of resamples per case for a stable 95% tail, and
  would still differ from run to run.
- **p-value**: two-sided Mann–Whitney U of the two sample sets; **q-value**: Benjamini–Hochberg
  across the compared cases, so a sweep of 1,000 cases at alpha 0.05 does not report ~50 changes
  out of pure noise (the false discovery rate among the `faster`/`slower` verdicts stays at alpha).
- **verdict** against the minimum effect e (`--min-effect`, default 0.02):
  `slower` when the whole interval lies above 1 + e and q < alpha; `faster` when it lies below
  1 − e and q < alpha; `same` when the whole interval lies inside [1 − e, 1 + e] (an equivalence
  claim, not merely "no significant difference"); `ambiguous` otherwise (too noisy to say either);
  `missing` when either side has no `ok` row with samples.
- **conditions neither run controlled** (report/compare_conditions.py) are the placement spread, a
  launch-gap level difference, and CPU contention. A difference they could account for is not called
  `faster` or `slower`: their size widens e, and contention holds both back (operatorx/uncontrolled.py).
  `numbers_verdict` and `verdict_why` say when that changed a verdict. Rows measured at one operand
  placement are flagged `placement not controlled`, per run when every case is.

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

Conditions that make the numbers less comparable are flagged, never hidden. Per case: every note the
terminal table gives either row (capped clock, L2 state not verified, ncu-perturbed, CPU contended,
host-bound, noise ...), and what differs between the rows (timing method, clock, L2 state, GPU,
backend, launch-gap level). Per comparison: GPU, driver, software versions, timing settings.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Optional, cast

import numpy as np

from operatorx.report.compare_conditions import LAUNCH_GAP_STEP_US, pair_conditions
from operatorx.result import Headline, Row
from operatorx.shift import hodges_lehmann
from operatorx.uncontrolled import Uncontrolled, decide

__all__ = ["CaseComparison", "Comparison", "Verdict", "compare_documents", "compare_samples", "hodges_lehmann",
           "benjamini_hochberg", "mann_whitney_p"]

Verdict = Literal["faster", "slower", "same", "ambiguous", "missing"]


@dataclass(frozen=True)
class CaseComparison:
    case_key: str
    label: str
    a_latency_us: Optional[float]
    b_latency_us: Optional[float]
    ratio: Optional[float]
    """B/A, the Hodges–Lehmann ratio (the median of all pairwise b / a): above 1 is slower. It lies inside
    [ci_low, ci_high]. a_latency_us and b_latency_us are each side's median."""
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
    numbers_verdict: Optional[Verdict] = None
    """The verdict of the numbers alone, set only where a condition neither run controlled changed it."""
    verdict_why: Optional[str] = None
    """Which conditions changed the verdict (`slower by the numbers alone, not called so: within ...`)."""
    conditions: list[dict[str, Any]] = field(default_factory=list)
    """The conditions neither run controlled (`Uncontrolled.to_json()`: kind, text, band_rel)."""

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
    """(ratio B/A, CI low, CI high, Mann–Whitney p) of two sample sets (µs, all > 0). The ratio and the
    interval are the Hodges–Lehmann shift of the log times and its interval, exponentiated, so
    low <= ratio <= high. The interval is NaN when the samples are too few for one."""
    a, b = np.asarray(a_us, dtype=float), np.asarray(b_us, dtype=float)
    if not (np.all(a > 0) and np.all(b > 0)):
        raise ValueError("samples must be positive times")
    la, lb = np.log(a), np.log(b)
    shift, lo, hi = hodges_lehmann(la, lb, confidence)
    ratio = math.exp(shift)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return ratio, math.nan, math.nan, mann_whitney_p(la, lb)
    return ratio, math.exp(lo), math.exp(hi), mann_whitney_p(la, lb)


def _verdict(lo: float, hi: float, q: float, min_effect: float, alpha: float) -> Verdict:
    """NaN bounds (no interval) compare false everywhere: `ambiguous`. `min_effect` is the band a
    difference must leave: --min-effect, or wider where a condition neither run controlled widens it."""
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
    not_controlled: list[Optional[str]] = []
    for key, s, q in zip(keys, stats, qs, strict=True):
        a, b = rows_a.get(key), rows_b.get(key)
        some = a or b
        assert some is not None
        sa, sb = _samples(a, metric), _samples(b, metric)
        pair = pair_conditions(a, b, metric)
        flags = list(pair.flags)
        numbers: Optional[Verdict] = None
        why: Optional[str] = None
        if s is None or q is None:
            flags = [f"no ok row with {metric} samples in {side}" if len(x) < 2 else f"a sample <= 0 µs in {side}"
                     for side, x in (("A", sa), ("B", sb)) if not _usable(x)] + flags
            verdict: Verdict = "missing"
            ratio = lo = hi = p = None
        else:
            ratio, lo, hi, p = s
            verdict, numbers, why = _decide(lo, hi, q, min_effect, alpha, pair.uncontrolled)
            if not (math.isfinite(lo) and math.isfinite(hi)):
                flags.insert(0, "too few samples for an interval")
            not_controlled.append(pair.not_controlled)
        cases.append(CaseComparison(
            case_key=some.case.key(), label=some.label(), side=key[1],
            a_latency_us=float(np.median(sa)) if sa else None, b_latency_us=float(np.median(sb)) if sb else None,
            ratio=ratio, ci_low=_finite(lo), ci_high=_finite(hi), p_value=p, q_value=q if s else None,
            verdict=verdict, flags=flags, a_samples=len(sa), b_samples=len(sb),
            backend_a=a.backend if a else None, backend_b=b.backend if b else None,
            case_index_a=a.case_index if a else None, case_index_b=b.case_index if b else None,
            numbers_verdict=numbers, verdict_why=why, conditions=[c.to_json() for c in pair.uncontrolled]))
    run_a, run_b = doc_a.get("run") or {}, doc_b.get("run") or {}
    run_flags = _run_flags(run_a, run_b, metric)
    cases = _placement_control(cases, not_controlled, run_flags)
    return Comparison(a=str(run_a.get("id", "A")), b=str(run_b.get("id", "B")), min_effect=min_effect, alpha=alpha,
                      metric=metric, cases=cases, flags=run_flags)


def _decide(lo: float, hi: float, q: float, min_effect: float, alpha: float, conditions: list[Uncontrolled]
            ) -> tuple[Verdict, Optional[Verdict], Optional[str]]:
    """(verdict, the numbers' verdict where a condition changed it, why) under the pair's conditions."""
    decision = decide(lambda band: _verdict(lo, hi, q, band, alpha), min_effect, conditions, "ambiguous")
    verdict = cast(Verdict, decision.verdict)
    if not decision.because:
        return verdict, None, None
    return verdict, cast(Verdict, decision.numbers_verdict), decision.why


def _placement_control(cases: list[CaseComparison], not_controlled: list[Optional[str]],
                       run_flags: list[str]) -> list[CaseComparison]:
    """Say where placement was not controlled: once for the comparison when every compared case says
    the same (two runs of one placement each), else on each case that lacks it."""
    said = set(not_controlled)
    if len(said) == 1 and None not in said and not_controlled:
        run_flags.append(f"{said.pop()}: every compared row was measured at one operand placement "
                         "(--placements); a difference up to the shape's placement effect (docs/compare.md) "
                         "is not told apart from a change")
        return cases
    compared = iter(not_controlled)
    out = []
    for c in cases:
        if c.verdict == "missing":
            out.append(c)
            continue
        note = next(compared)
        out.append(c if note is None else replace(c, flags=[*c.flags, note]))
    return out


def _usable(samples: list[float]) -> bool:
    """At least two samples, all positive times (a ratio of logs needs them)."""
    return len(samples) >= 2 and min(samples) > 0


def _finite(v: Optional[float]) -> Optional[float]:
    return v if v is not None and math.isfinite(v) else None
