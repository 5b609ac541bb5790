"""Verdicts that account for what neither run controlled, and flags that reach every output whole.

The planted scenario of issue 32: two CPU runs whose rows say `cpu_contended`, B 10% faster on all 12
cases. Before, that compared as "12 faster" with no flag. Placement spreads and launch-gap levels
widen the band a difference must leave; rows measured at one placement say so."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from operatorx.cli import app
from operatorx.report.compare import compare_documents
from operatorx.report.compare_conditions import placement_of
from operatorx.report.compare_table import comparison_csv, comparison_markdown, comparison_table
from operatorx.result import Row
from tests.report.rows import make_row
from tests.report.test_compare import _case, _samples

WHY = ("41 of 60 samples taken lost the CPU (run-queue wait > 5% of their wall time, schedstat_run_delay) and were "
       "dropped: the machine was busy; the number is from the clean ones")
CONTENDED = {"clock": "host", "method": "host_clock/perf_counter",
             "timing": {"cpu_contended": True, "cpu_contended_why": WHY, "contended_samples_dropped": 41}}


def _doc(run_id: str, factor: float, cases: int = 12, seed: int = 0, per_case=None, **metrics):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(cases):
        s = [v * factor for v in _samples(rng, n=60)]
        extra = {**metrics, **((per_case or {}).get(i, {}))}
        rows.append(make_row(case=_case(i + 1), index=i, samples_us=s, latency_us=float(np.median(s)),
                             **extra).to_json())
    return {"schema_version": "1", "run": {"id": run_id}, "rows": rows}


def test_two_contended_cpu_runs_are_never_called_faster():
    plain = compare_documents(_doc("A", 1.0), _doc("B", 0.9, seed=1))
    assert plain.counts()["faster"] == 12                     # the numbers alone: what was printed before
    c = compare_documents(_doc("A", 1.0, **CONTENDED), _doc("B", 0.9, seed=1, **CONTENDED))
    assert c.counts() == {"faster": 0, "slower": 0, "same": 0, "ambiguous": 12, "missing": 0}
    for case in c.cases:
        assert case.numbers_verdict == "faster"
        assert case.verdict_why == "faster by the numbers alone, not called so: under CPU contention"
        assert case.conditions == [{"kind": "cpu_contention", "band_rel": None, "text": (
            "CPU contended in A and B: other processes had the CPU while it was timed, at a load two runs need not "
            "share")}]
        assert f"A and B: CPU contended: {WHY}" in case.flags               # the terminal's note, whole
        assert case.ci_low is not None and case.ci_high is not None and case.ci_low <= case.ratio <= case.ci_high


def test_the_contention_flags_reach_json_markdown_csv_and_the_table_whole(tmp_path):
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(_doc("A", 1.0, **CONTENDED)))
    pb.write_text(json.dumps(_doc("B", 0.9, seed=1, **CONTENDED)))
    run = CliRunner()
    out = json.loads(run.invoke(app, ["results", "compare", str(pa), str(pb), "--json"]).output)
    assert out["counts"]["faster"] == 0 and all(f"A and B: CPU contended: {WHY}" in c["flags"] for c in out["cases"])
    assert all(c["verdict_why"].endswith("under CPU contention") for c in out["cases"])
    md = run.invoke(app, ["results", "compare", str(pa), str(pb), "--markdown"]).output
    assert md.count("under CPU contention") == 12
    assert md.count("dropped: the machine was busy; the number is from the clean ones") == 12     # never cut
    text = run.invoke(app, ["results", "compare", str(pa), str(pb), "--csv"]).output
    lines = list(csv.DictReader(io.StringIO(text)))
    cases = [x for x in lines if x["label"] != "(comparison)"]
    assert len(cases) == 12 and all(WHY in x["flags"] and x["numbers_verdict"] == "faster" for x in cases)
    assert all(x["verdict"] == "ambiguous" for x in cases)
    comp = compare_documents(json.loads(pa.read_text()), json.loads(pb.read_text()))
    table = comparison_table(comp)
    flags = [str(cell) for cell in table.columns[7].cells]
    assert all(WHY in f and "under CPU contention" in f for f in flags)
    assert comparison_markdown(comp) == md
    assert list(csv.reader(io.StringIO(comparison_csv(comp)))) == list(csv.reader(io.StringIO(text)))


def _placement(spread_pct: float, count: int = 3):
    return {"placement": {"count": count, "requested": count, "per_placement_us": [20.0] * count,
                          "spread_pct": spread_pct, "pad_bytes": [0] * count, "rounds": 2}}


def test_a_difference_within_the_placement_spread_is_not_slower():
    a = _doc("A", 1.0, cases=2, **_placement(8.0))
    b = _doc("B", 1.05, cases=2, seed=1, **_placement(4.0))
    c = compare_documents(a, b)
    assert [x.verdict for x in c.cases] == ["same", "same"]
    assert all(x.numbers_verdict == "slower" for x in c.cases)
    assert c.cases[0].verdict_why == "slower by the numbers alone, not called so: within the placement spread (±12.0%)"
    assert c.cases[0].flags[0] == ("placement spread A 8.0% over 3 placements + B 4.0% over 3 placements: a difference "
                                   "within 12.0% may be where the operands lie")
    assert placement_of(Row.from_json(a["rows"][0])).spread_pct == 8.0
    assert not any("placement not controlled" in f for f in c.flags + c.cases[0].flags)
    bigger = compare_documents(a, _doc("B", 1.25, cases=2, seed=1, **_placement(4.0)))
    assert [x.verdict for x in bigger.cases] == ["slower", "slower"] and bigger.cases[0].verdict_why is None


def test_runs_of_one_placement_say_placement_was_not_controlled():
    c = compare_documents(_doc("A", 1.0, cases=3), _doc("B", 1.0, cases=3, seed=1))
    said = [f for f in c.flags if f.startswith("placement not controlled")]
    assert said == ["placement not controlled in A and B: every compared row was measured at one operand placement "
                    "(--placements); a difference up to the shape's placement effect (docs/compare.md) is not told "
                    "apart from a change"]
    assert not any("placement" in f for x in c.cases for f in x.flags)
    one = compare_documents(_doc("A", 1.0, cases=3, **_placement(1.0, count=1)),
                            _doc("B", 1.0, cases=3, seed=1, **_placement(1.0)))
    assert [f for f in one.flags if f.startswith("placement")][0].startswith("placement not controlled in A:")


def test_a_mixed_pair_of_runs_says_it_per_case():
    a = _doc("A", 1.0, cases=3, **_placement(1.0))
    b = _doc("B", 1.0, cases=3, seed=1, per_case={0: _placement(1.0), 1: _placement(1.0)})
    c = compare_documents(a, b)
    assert not any("placement not controlled" in f for f in c.flags)
    assert [("placement not controlled in B" in x.flags) for x in c.cases] == [False, False, True]


def test_one_side_of_one_placement_keeps_the_other_sides_spread_and_says_so():
    comp = compare_documents(_doc("A", 1.0, cases=1, **_placement(9.0)), _doc("B", 1.05, cases=1, seed=1))
    c = comp.cases[0]
    assert c.verdict == "same" and c.conditions[0]["band_rel"] == pytest.approx(0.09)
    assert [f for f in comp.flags if f.startswith("placement")][0].startswith("placement not controlled in B: ")


def _gaps(gap_us: float) -> dict:
    return {"timing": {"launch_gap_us": gap_us},
            "profile": {"kernels": [{"name": f"k{i}", "count_per_call": 1.0} for i in range(10)]}}


def test_a_difference_within_the_launch_gap_shift_is_not_slower():
    """Ten kernels at 0.96 vs 1.12 µs a boundary: about +1.44 µs of a 20 µs span (7.2%). A 5% change in B
    is within it; a 20% one is not."""
    a = _doc("A", 1.0, cases=1, **_gaps(0.96))
    c = compare_documents(a, _doc("B", 1.05, cases=1, seed=1, **_gaps(1.12))).cases[0]
    assert c.verdict in ("same", "ambiguous") and c.numbers_verdict == "slower"
    assert c.verdict_why is not None and "within the launch-gap level difference (±7." in c.verdict_why
    assert c.conditions[0]["kind"] == "launch_gap" and c.conditions[0]["band_rel"] == pytest.approx(1.44 / 20, rel=0.05)
    far = compare_documents(a, _doc("B", 1.2, cases=1, seed=1, **_gaps(1.12))).cases[0]
    assert far.verdict == "slower" and far.verdict_why is None


def test_every_note_the_terminal_table_gives_a_row_reaches_its_comparison():
    host = {"host": {"host_us_per_call": 80.0, "device_us_per_call": 20.0, "host_bound": True,
                     "warnings": ["a TorchFunctionMode is active"]}}
    a = _doc("A", 1.0, cases=1, noise=0.05, stop_reason="time_cap")
    b = _doc("B", 1.0, cases=1, seed=1, noise=0.05, stop_reason="time_cap", **host)
    flags = compare_documents(a, b).cases[0].flags
    assert "A and B: median ±5.0%" in flags
    assert "B: host-bound" in flags and "B: host: a TorchFunctionMode is active" in flags
