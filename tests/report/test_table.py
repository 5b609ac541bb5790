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
