"""What a row's note says about how sure its number is, and the busy/span columns."""

from __future__ import annotations

from rich.console import Console

from operatorx.report.table import fmt, row_columns, row_note, rows_table
from tests.report.rows import make_row, ranked_row


def _row(**metrics):
    return make_row("ok", **metrics)


def _text(table) -> str:
    console = Console(width=250, record=True)
    console.print(table)
    return console.export_text()


def test_a_clean_row_has_no_note():
    assert row_note(_row(capped=False, l2_verified=True, stop_reason="noise_target", noise=0.002)) == ""


def test_the_note_names_cap_unverified_l2_perturbation_and_noise():
    note = row_note(_row(capped=True, telemetry={"capping_reasons": ["sw_power_cap"]}, l2_state="cold_clean",
                         l2_verified=False, perturbed="timed while running under ncu (--counters)",
                         stop_reason="time_cap", noise=0.012))
    assert "clock capped: sw_power_cap" in note and "L2 state cold_clean not verified" in note
    assert "perturbed (ncu)" in note and "median ±1.2%" in note


def test_the_note_says_when_starved_calls_were_kept_or_device_work_was_unattributed():
    note = row_note(_row(stop_reason="noise_target", noise=0.002,
                         timing={"host_gaps_included": True, "unattributed_activities": 3, "noise_target": 0.005}))
    assert "host gaps included" in note and "3 device activities unattributed" in note
    assert row_note(_row(stop_reason="noise_target", noise=0.002,
                         timing={"host_gaps_included": False, "unattributed_activities": 0})) == ""


def test_max_samples_short_of_the_noise_target_shows_the_noise_reached():
    timing = {"noise_target": 0.005}
    assert "median ±0.9%" in row_note(_row(stop_reason="max_samples", noise=0.009, timing=timing))
    assert row_note(_row(stop_reason="max_samples", noise=0.004, timing=timing)) == ""


def test_a_time_capped_row_without_a_known_noise_says_so():
    note = row_note(_row(stop_reason="time_cap", noise=None, summary_us={"median": 10.0, "n": 4}))
    assert note == "median noise unknown (4 samples)"


def test_missing_and_error_kinds_are_named():
    assert row_note(make_row("missing")) == "not run: planned, not finished"
    crashed = make_row("error", "worker exited", error_kind="crashed")
    assert row_note(crashed) == "worker exited; error kind: crashed"


# --- busy and span ------------------------------------------------------------------------------

FP8_ROWWISE = dict(latency_us=33.2, busy_us=24.1, flops=2 * 7168 * 2048, min_bytes=7168 * 2048 + 2 * 7168 + 2 * 2048,
                   tflops=2 * 7168 * 2048 / 33.2 / 1e6, gbps=(7168 * 2048 + 2 * 7168 + 2 * 2048) / 33.2 / 1e3,
                   profile={"calls": 32, "kernels": [{"name": f"k{i}", "count_per_call": 1.0} for i in range(9)]})


def test_busy_and_gaps_stand_beside_the_span_where_they_differ_by_more_than_3_percent():
    multi, single = _row(**FP8_ROWWISE), _row(latency_us=10.0, busy_us=9.8)
    names = [name for name, _ in row_columns([multi, single])]
    assert names[4:7] == ["latency_us", "busy_us", "gaps_us"]
    text = _text(rows_table([multi.to_json(), single.to_json()]))
    line = next(t for t in text.splitlines() if "33.20" in t)
    assert "24.10" in line and "9.10" in line
    assert "span 33.2 = busy 24.1 + gaps 9.1 µs between 9 kernels (8 boundaries)" in row_note(multi)
    other = next(t for t in text.splitlines() if "10.00" in t)
    assert "9.80" not in other                      # within 3%: the span alone
    assert [name for name, _ in row_columns([single])][4:6] == ["latency_us", "TFLOP/s"]


def test_headline_busy_leads_with_busy_time_and_its_rates():
    row = _row(**FP8_ROWWISE)
    names = [name for name, _ in row_columns([row], "busy")]
    assert names[4:7] == ["busy_us", "span_us", "gaps_us"]
    text = _text(rows_table([row], headline="busy"))
    span_tflops, busy_tflops = FP8_ROWWISE["tflops"], FP8_ROWWISE["flops"] / 24.1 / 1e6
    assert fmt(busy_tflops) in text and fmt(span_tflops) not in text
    cpu = _row(latency_us=5.0, clock="host")
    assert "busy time unknown: span shown" in row_note(cpu, "busy")


def test_rich_markup_and_control_characters_in_a_message_are_printed_as_text():
    text = _text(rows_table([make_row("unsupported", "[red]no[/red] \x1b[31mkernel")]))
    assert "[red]no[/red] kernel" in text


# --- a multi-rank row ---------------------------------------------------------------------------

def test_world_and_skew_follow_the_times_where_a_row_ran_over_several_ranks():
    ranked, single = ranked_row(0), _row()
    names = [name for name, _ in row_columns([ranked, single])]
    assert names[4:8] == ["latency_us", "world", "skew_us", "TFLOP/s"]
    assert "world" not in [name for name, _ in row_columns([single])]
    text = _text(rows_table([ranked.to_json(), single.to_json()]))
    cells = next(t for t in text.splitlines() if "tp2" in t).split("│")
    # latency 43.00 (the slowest rank's median), world 2, skew 1.80 (median max − min per iteration)
    assert [c.strip() for c in cells[5:8]] == ["43.00", "2", "1.80"]
    other = next(t for t in text.splitlines() if "gemm 1x2x3" in t).split("│")
    assert [c.strip() for c in other[5:8]] == ["10.00", "", ""]          # single-rank: blank, not `-`


def test_a_capped_rank_is_named_with_its_own_reasons():
    # the row's telemetry is rank 0's (uncapped); rank 1's says why
    assert "clock capped on rank 1 of 2: sw_power_cap" in row_note(ranked_row())
