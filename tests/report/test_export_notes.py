"""The exports carry what the terminal shows, whole: a row's notes in the CSV, an A/B row's held-back
verdict in the CSV, the A/B table and its Markdown, and what B−A means."""

from __future__ import annotations

import csv
import io

import pytest

from operatorx.report.ab import DIFFERENCE_SAYS, ab_markdown, ab_notes, ab_table
from operatorx.report.csv import document_csv
from operatorx.report.table import row_note
from tests.report.rows import make_row, ranked_row

WHY = ("all 40 samples the number is taken from lost the CPU (run-queue wait > 5% of their wall time, "
       "schedstat_run_delay) and no clean set was left: the number is kept but includes waiting for a CPU on a busy "
       "machine")


def test_the_rows_csv_has_every_note_whole():
    row = make_row(clock="host", timing={"cpu_contended": True, "cpu_contended_why": WHY},
                   host={"host_us_per_call": 50.0, "device_us_per_call": 10.0, "host_bound": True})
    doc = {"run": {"id": "R"}, "rows": [row.to_json()]}
    line = next(csv.DictReader(io.StringIO(document_csv(doc))))
    assert line["notes"] == row_note(row) and f"CPU contended: {WHY}" in line["notes"] and "host-bound" in line["notes"]


_HELD = {"a_us": 10.0, "b_us": 9.0, "diff_us": -1.0, "ci_low_us": -1.2, "ci_high_us": -0.8, "verdict": "inconclusive",
         "numbers_verdict": "faster", "verdict_why": "faster by the numbers alone, not called so: under CPU contention",
         "conditions": [{"kind": "cpu_contention", "band_rel": None,
                         "text": "CPU contended in B: the number includes batches that waited for a CPU"}],
         "warnings": {"b": [WHY]}}
AB_ROW = {"label": "gemm 1x64x64", "status": "ok", "host": _HELD, "device": None, "outputs": {"result": "bitwise"}}


def test_an_ab_rows_notes_say_why_its_verdict_was_held_and_the_host_warnings():
    assert ab_notes(AB_ROW) == ["host: faster by the numbers alone, not called so: under CPU contention",
                                "host: CPU contended in B: the number includes batches that waited for a CPU",
                                f"host B: {WHY}"]


def test_the_ab_markdown_and_table_carry_the_notes_whole_and_say_what_b_minus_a_is():
    md = ab_markdown([AB_ROW])
    assert md.startswith(DIFFERENCE_SAYS) and "| inconclusive |" in md
    assert "bitwise; host: faster by the numbers alone, not called so: under CPU contention" in md
    assert "on a busy machine" in md.split("host B: ")[1]                         # the warning, to its end
    table = ab_table([AB_ROW])
    assert str(list(table.columns[-1].cells)[0]).endswith("includes waiting for a CPU on a busy machine")


def test_the_ab_csv_says_why_the_verdict_was_held():
    row = make_row(ab={**AB_ROW, "host": {k: v for k, v in _HELD.items() if k != "warnings"}})
    row = row.model_copy(update={"measured": None})
    doc = {"run": {"id": "R", "kind": "ab"}, "rows": [row.to_json()]}
    line = next(csv.DictReader(io.StringIO(document_csv(doc))))
    assert (line["ab_clock"], line["verdict"], line["diff_us"]) == ("host", "inconclusive", "-1.0")
    assert line["verdict_why"] == "faster by the numbers alone, not called so: under CPU contention"


def test_the_rows_csv_carries_a_multi_rank_rows_world_split_fastest_rank_skew_and_capped_ranks():
    doc = {"run": {"id": "R"}, "rows": [ranked_row(0).to_json(), make_row(index=1).to_json()]}
    ranked, single = csv.DictReader(io.StringIO(document_csv(doc)))
    assert (ranked["latency_us"], ranked["world"], ranked["split"], ranked["latency_us_min"]) == ("43.0", "2", "tp2",
                                                                                                  "41.2")
    assert float(ranked["skew_us"]) == pytest.approx(1.8) and ranked["capped_ranks"] == "[1]"
    assert "clock capped on rank 1 of 2: sw_power_cap" in ranked["notes"]
    assert [single[k] for k in ("world", "split", "latency_us_min", "skew_us", "capped_ranks")] == [""] * 5
