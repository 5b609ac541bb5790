"""What a row's note says about how sure its number is."""

from __future__ import annotations

from operatorx.report.table import row_note


def _row(**metrics):
    return {"status": "ok", "metrics": {"latency_us": 10.0, **metrics}}


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
    note = row_note(_row(stop_reason="time_cap", noise=None, summary_us={"n": 4}))
    assert note == "median noise unknown (4 samples)"
