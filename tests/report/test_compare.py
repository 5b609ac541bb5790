"""Regression verdicts from raw samples: planted changes, identical runs, tiny drifts, FDR, missing rows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from operatorx import shift
from operatorx.report import compare as cmp
from operatorx.report.compare import benjamini_hochberg, compare_documents, compare_samples, hodges_lehmann
from operatorx.spec import Case
from tests.report.rows import make_row


def _case(m: int) -> Case:
    return Case.model_validate({"type": "gemm", "args": {"m": m, "n": 256, "k": 256, "a": {"dtype": "bf16"},
                                                         "b": {"dtype": "bf16"}, "out": "bf16"}})


def _samples(rng, n=300, center=20.0, noise=0.01):
    """µs-scale GPU-like samples: lognormal spread plus a sparse tail of slow calls."""
    x = center * np.exp(rng.normal(0, noise, n))
    x[rng.random(n) < 0.03] *= 1.3
    return [float(v) for v in x]


def _doc(run_id, samples_by_m, status_by_m=None, run=None, **row_metrics):
    rows = []
    for i, (m, samples) in enumerate(samples_by_m.items()):
        status = (status_by_m or {}).get(m, "ok")
        metrics = {"latency_us": float(np.median(samples)), "samples_us": samples, **row_metrics} \
            if status == "ok" else {}
        rows.append(make_row(status, case=_case(m), index=i, **metrics).to_json())
    return {"schema_version": "1", "run": {"id": run_id, **(run or {})}, "rows": rows}


def test_a_planted_5_percent_slowdown_is_slower():
    rng = np.random.default_rng(1)
    a = _doc("A", {1: _samples(rng)})
    b = _doc("B", {1: [v * 1.05 for v in _samples(rng)]})
    c = compare_documents(a, b).cases[0]
    assert c.verdict == "slower", c
    assert c.ratio == pytest.approx(1.05, rel=0.01)
    assert c.ci_low is not None and c.ci_high is not None and 1.02 < c.ci_low < 1.05 < c.ci_high < 1.08
    assert c.p_value is not None and c.p_value < 1e-6 and c.q_value == c.p_value     # one case: q = p
    faster = compare_documents(b, a).cases[0]
    assert faster.verdict == "faster" and faster.ratio == pytest.approx(1 / 1.05, rel=0.01)


def test_identical_samples_are_the_same():
    rng = np.random.default_rng(2)
    s = _samples(rng)
    c = compare_documents(_doc("A", {1: s}), _doc("B", {1: list(s)})).cases[0]
    assert c.verdict == "same" and c.ratio == 1.0 and c.p_value == pytest.approx(1.0)
    assert c.ci_low is not None and c.ci_high is not None and 0.98 <= c.ci_low <= 1 <= c.ci_high <= 1.02
    constant = compare_documents(_doc("A", {1: [5.0] * 20}), _doc("B", {1: [5.0] * 20})).cases[0]
    assert constant.verdict == "same" and (constant.ci_low, constant.ci_high) == (1.0, 1.0)


@pytest.mark.parametrize("seed", range(20))
def test_a_0_3_percent_change_is_never_slower(seed):
    rng = np.random.default_rng(100 + seed)
    a = _doc("A", {1: _samples(rng, n=2000, noise=0.002)})
    b = _doc("B", {1: [v * 1.003 for v in _samples(rng, n=2000, noise=0.002)]})
    c = compare_documents(a, b).cases[0]
    assert c.verdict in ("same", "ambiguous"), c
    assert c.verdict == "same"           # with 2,000 samples of 0.2% noise the interval is well inside ±2%


def test_a_noisy_case_with_a_real_but_uncertain_change_is_ambiguous():
    rng = np.random.default_rng(3)
    a = _doc("A", {1: _samples(rng, n=40, noise=0.05)})
    b = _doc("B", {1: [v * 1.03 for v in _samples(rng, n=40, noise=0.05)]})
    assert compare_documents(a, b).cases[0].verdict == "ambiguous"


def test_min_effect_decides_what_matters():
    rng = np.random.default_rng(4)
    a = _doc("A", {1: _samples(rng, n=2000, noise=0.002)})
    b = _doc("B", {1: [v * 1.01 for v in _samples(rng, n=2000, noise=0.002)]})
    assert compare_documents(a, b, min_effect=0.02).cases[0].verdict == "same"
    assert compare_documents(a, b, min_effect=0.005).cases[0].verdict == "slower"
    c = compare_documents(a, b).cases[0]
    assert c.ci_low is not None and c.ci_high is not None
    straddling = (c.ci_low + c.ci_high) / 2 - 1
    assert compare_documents(a, b, min_effect=straddling).cases[0].verdict == "ambiguous"


def test_benjamini_hochberg_values():
    q = benjamini_hochberg([0.01, 0.04, 0.03, None, 0.005])
    # sorted p: 0.005 (r1), 0.01 (r2), 0.03 (r3), 0.04 (r4); m = 4
    assert q[4] == pytest.approx(0.02) and q[0] == pytest.approx(0.02)
    assert q[2] == pytest.approx(0.04) and q[1] == pytest.approx(0.04) and q[3] is None
    assert benjamini_hochberg([]) == []


def test_bh_across_cases_holds_back_a_change_whose_p_alone_would_pass(monkeypatch):
    """50 cases: one with p = 0.01 and a large shift, 49 null ones with p = 0.5. Alone, p < 0.05 and the
    interval beyond the band would say `slower`; across 50 cases its q = 0.5 and the verdict is not."""
    rng = np.random.default_rng(5)
    base = {m: _samples(rng, n=50) for m in range(1, 51)}
    shifted = {m: ([v * 1.2 for v in s] if m == 1 else s) for m, s in base.items()}
    real = cmp.compare_samples

    def fixed_p(a, b, confidence=0.95):
        ratio, lo, hi, _ = real(a, b, confidence)
        return ratio, lo, hi, (0.01 if ratio > 1.1 else 0.5)

    monkeypatch.setattr(cmp, "compare_samples", fixed_p)
    many = compare_documents(_doc("A", base), _doc("B", shifted))
    first = many.cases[0]
    assert first.p_value == 0.01 and first.q_value == pytest.approx(0.5) and first.verdict == "ambiguous"
    alone = compare_documents(_doc("A", {1: base[1]}), _doc("B", {1: shifted[1]})).cases[0]
    assert alone.q_value == 0.01 and alone.verdict == "slower"


def test_missing_when_either_side_has_no_ok_row():
    rng = np.random.default_rng(6)
    a = _doc("A", {1: _samples(rng), 2: _samples(rng), 3: _samples(rng)}, status_by_m={3: "error"})
    b = _doc("B", {1: _samples(rng), 3: _samples(rng), 4: _samples(rng)})
    c = compare_documents(a, b)
    by_m = {cc.label.split()[1].split("x")[0]: cc for cc in c.cases}
    assert [cc.verdict for cc in c.cases][1:] == ["missing"] * 3
    assert by_m["2"].b_latency_us is None and "no ok row with span samples in B" in by_m["2"].flags
    assert "no ok row with span samples in A" in by_m["3"].flags and by_m["4"].case_index_a is None
    assert c.counts()["missing"] == 3 and by_m["1"].q_value is not None


def test_a_zero_sample_makes_the_case_missing_not_the_comparison_fail():
    rng = np.random.default_rng(13)
    c = compare_documents(_doc("A", {1: [0.0, *_samples(rng, n=20)], 2: _samples(rng)}),
                          _doc("B", {1: _samples(rng, n=20), 2: _samples(rng)}))
    assert [x.verdict for x in c.cases] == ["missing", "same"] and "a sample <= 0 µs in A" in c.cases[0].flags


def test_flags_name_what_differs():
    rng = np.random.default_rng(7)
    s = _samples(rng)
    a = _doc("A", {1: s}, run={"device": {"name": "NVIDIA H200"}, "driver": "570.1",
                               "software": {"torch": "2.9", "vllm": "0.26"}, "timing": {"mode": "kernels"}})
    b = _doc("B", {1: s}, run={"device": {"name": "NVIDIA B200"}, "driver": "575.2",
                               "software": {"torch": "2.10", "vllm": "0.26"}, "timing": {"mode": "graph"}},
             capped=True, l2_verified=False, l2_state="cold_clean", method="cuda_events")
    c = compare_documents(a, b)
    assert "GPUs differ: NVIDIA H200 vs NVIDIA B200" in c.flags and "drivers differ: 570.1 vs 575.2" in c.flags
    assert "software differs: torch 2.9 vs 2.10" in c.flags and "timing modes differ: kernels vs graph" in c.flags
    flags = c.cases[0].flags
    assert "B: clock capped: ?" in flags and "B: L2 state cold_clean not verified" in flags   # the table's notes
    assert "timing methods differ: None vs cuda_events" not in flags        # A has no method: nothing to compare
    assert c.to_json()["counts"]["same"] == 1


def test_busy_metric_uses_busy_samples():
    rng = np.random.default_rng(8)
    span = _samples(rng)
    a = _doc("A", {1: span}, busy_samples_us=[v * 0.7 for v in span])
    b = _doc("B", {1: span}, busy_samples_us=[v * 0.7 * 1.1 for v in span])
    assert compare_documents(a, b).cases[0].verdict == "same"
    busy = compare_documents(a, b, metric="busy").cases[0]
    assert busy.verdict == "slower" and busy.ratio == pytest.approx(1.1)


def test_rows_of_two_backends_in_one_run_are_matched_by_backend_too():
    rng = np.random.default_rng(9)
    s = _samples(rng)
    rows = [make_row(case=_case(1), samples_us=s, latency_us=20.0).model_copy(update={"backend": be}).to_json()
            for be in ("torch", "vllm")]
    doc = {"run": {"id": "R"}, "rows": rows}
    c = compare_documents(doc, doc)
    assert [(x.backend_a, x.verdict) for x in c.cases] == [("torch", "same"), ("vllm", "same")]


# --- the statistics themselves ------------------------------------------------------------------

def test_hodges_lehmann_direct_and_bisection_agree(monkeypatch):
    rng = np.random.default_rng(10)
    x, y = rng.normal(0, 1, 300), rng.normal(0.2, 1, 400)
    direct = hodges_lehmann(x, y)
    monkeypatch.setattr(shift, "_DIRECT_PAIRS", 0)
    bisected = hodges_lehmann(x, y)
    assert bisected == direct                 # bisection ends on the differences themselves: exactly equal
    d = np.sort((y[:, None] - x[None, :]).ravel())
    assert direct[0] == pytest.approx((d[d.size // 2 - 1] + d[d.size // 2]) / 2)


def test_mann_whitney_p_matches_scipys_asymptotic_test():
    from scipy.stats import mannwhitneyu

    rng = np.random.default_rng(12)
    for n, m, moved in ((30, 40, 0.3), (200, 150, 0.05), (12, 12, 0.0)):
        x, y = np.round(rng.normal(0, 1, n), 1), np.round(rng.normal(moved, 1, m), 1)   # rounded: ties
        expected = mannwhitneyu(y, x, alternative="two-sided", method="asymptotic").pvalue
        assert cmp.mann_whitney_p(x, y) == pytest.approx(expected, rel=1e-9)


def test_the_interval_covers_the_true_ratio_about_95_percent_of_the_time():
    rng = np.random.default_rng(11)
    covered = 0
    for _ in range(300):
        a = 10 * np.exp(rng.normal(0, 0.02, 30))
        b = 10 * 1.04 * np.exp(rng.normal(0, 0.02, 30))
        _, lo, hi, _ = compare_samples(list(a), list(b))
        covered += lo <= 1.04 <= hi
    assert 0.91 <= covered / 300 <= 0.99


def test_too_few_samples_give_no_interval_and_no_verdict_either_way():
    a = _doc("A", {1: [10.0, 10.1, 9.9]})
    b = _doc("B", {1: [12.0, 12.1, 11.9]})
    c = compare_documents(a, b).cases[0]
    assert c.verdict == "ambiguous" and c.ci_low is None and "too few samples for an interval" in c.flags
    assert math.isclose(c.ratio or 0, 1.2)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="min_effect"):
        compare_documents({"rows": []}, {"rows": []}, min_effect=-0.1)
    with pytest.raises(ValueError, match="alpha"):
        compare_documents({"rows": []}, {"rows": []}, alpha=0)


def _profile(kernels: int) -> dict:
    return {"kernels": [{"name": f"k{i}", "count_per_call": 1.0} for i in range(kernels)]}


def _gap_doc(run_id, gap, kernels=10, method=None, profile=True):
    s = _samples(np.random.default_rng(11))
    extra = {"profile": _profile(kernels)} if profile else {}
    if method:
        extra["method"] = method
    return _doc(run_id, {1: s}, timing={"launch_gap_us": gap} if gap is not None else {}, **extra)


def _gap_flags(doc_a, doc_b, **kw):
    return [f for f in compare_documents(doc_a, doc_b, **kw).cases[0].flags if f.startswith("launch-gap")]


@pytest.mark.parametrize(("gap_a", "gap_b", "kernels", "flagged"), [
    (0.96, 1.12, 10, True),         # two levels, ten kernels: the span moves by ~1.4 µs
    (1.10, 1.155, 10, False),       # one level read twice (its readings spread ~0.06 µs)
    (0.96, 1.12, 1, False),         # a single kernel has no boundary to carry it
    (None, 1.12, 10, False),        # a row from before the probe: nothing to compare
])
def test_a_multi_kernel_call_timed_at_two_launch_gap_levels_is_flagged(gap_a, gap_b, kernels, flagged):
    said = _gap_flags(_gap_doc("A", gap_a, kernels), _gap_doc("B", gap_b, kernels))
    if flagged:
        assert said == ["launch-gap levels differ: 0.96 vs 1.12 µs a kernel boundary; over 9 boundaries about "
                        "+1.4 µs of span (busy time does not carry it)"]
    else:
        assert said == []


def test_the_launch_gap_flag_takes_bs_kernel_count_and_as_only_where_b_has_none():
    assert _gap_flags(_gap_doc("A", 1.12, kernels=10), _gap_doc("B", 0.96, kernels=1)) == []   # B: no boundary
    assert _gap_flags(_gap_doc("A", 1.12, kernels=10), _gap_doc("B", 0.96, profile=False)) == [
        "launch-gap levels differ: 1.12 vs 0.96 µs a kernel boundary; over 9 boundaries about -1.4 µs of span "
        "(busy time does not carry it)"]


def test_no_launch_gap_flag_for_graph_replays_or_the_busy_metric():
    graph = "cupti_kernels/cuda_graph"
    assert _gap_flags(_gap_doc("A", 0.96, method=graph), _gap_doc("B", 1.12, method=graph)) == []
    assert _gap_flags(_gap_doc("A", 0.96), _gap_doc("B", 1.12)) != []
    busy_a = _gap_doc("A", 0.96)
    busy_b = _gap_doc("B", 1.12)
    for d in (busy_a, busy_b):
        d["rows"][0]["metrics"]["busy_samples_us"] = d["rows"][0]["metrics"]["samples_us"]
    assert _gap_flags(busy_a, busy_b, metric="busy") == []


def _run(*levels):
    return {"workers": {f"gpu{i}": {"launch_gap": {"gap_us": g, "boundaries": 120}} for i, g in enumerate(levels)}}


def _run_gap_flags(run_a, run_b, metric="span"):
    s = _samples(np.random.default_rng(12))
    busy = {"busy_samples_us": s}
    c = compare_documents(_doc("A", {1: s}, run=run_a, **busy), _doc("B", {1: s}, run=run_b, **busy), metric=metric)
    return [f for f in c.flags if f.startswith("launch-gap")]


def test_runs_whose_workers_had_different_launch_gap_levels_are_flagged():
    said = ("launch-gap levels differ: {} vs {} µs a kernel boundary (multi-kernel spans carry it, busy "
            "times do not: --metric busy compares without it)")
    assert _run_gap_flags(_run(0.96), _run(1.10, 1.12)) == [said.format("0.96", "1.10-1.12")]
    assert _run_gap_flags(_run(0.96, 1.12), _run(0.96)) == [said.format("0.96 and 1.12", "0.96")]
    assert _run_gap_flags({"launch_gap": {"gap_us": 0.96}}, _run(1.12)) == [said.format("0.96", "1.12")]


def test_runs_at_the_same_levels_are_not_flagged_even_with_workers_at_two():
    assert _run_gap_flags(_run(1.10), _run(1.12, 1.13)) == []                   # one level, read by three workers
    assert _run_gap_flags(_run(0.96, 1.12, 0.97), _run(0.96, 1.12, 0.97)) == []  # a mixed run against itself
    assert _run_gap_flags(_run(0.96), _run(1.12), metric="busy") == []         # busy time does not carry it
    assert _run_gap_flags({}, _run(1.12)) == []                                 # a run from before the probe


def test_a_run_record_this_version_cannot_read_gives_no_flag_and_no_error():
    assert _run_gap_flags({"workers": {"gpu0": {"launch_gap": {"gap_us": "fast"}}}}, _run(1.12)) == []
    assert _run_gap_flags({"workers": ["gpu0"]}, _run(1.12)) == []


def test_levels_group_readings_within_a_step():
    assert cmp._launch_gap_levels([1.12, 0.96, 1.10, 0.97, 1.15]) == [[0.96, 0.97], [1.10, 1.12, 1.15]]
    assert cmp._launch_gap_levels([]) == []
