"""The timers' typed records (measure/record.py): closed, complete, and what the CPU timer really computes."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
from pydantic import ValidationError

from operatorx.measure.cpu_contention import ContentionProbe, CpuStamp
from operatorx.measure.host_clock import HostClockTiming
from operatorx.measure.record import (
    DeviceRecord,
    EventsRecord,
    HostClockRecord,
    HostTimeRecord,
    KernelPhases,
    KernelsRecord,
    TimerRecord,
)
from operatorx.measure.settings import TimingSettings
from operatorx.result import HostTime, Row, TimingInfo
from operatorx.spec import Case

ROW_TIMER_RECORDS = (TimerRecord, DeviceRecord, EventsRecord, KernelsRecord, HostClockRecord)

CLEAN = dict(l2_state="n/a (cpu)", spin=False, contention_signal="process_cpu_time", contended_samples_dropped=0,
             contended_samples_kept=0, cpu_wait_fraction=0.0, cpu_contended=False)


@pytest.mark.parametrize("model", [*ROW_TIMER_RECORDS, HostTimeRecord, KernelPhases])
def test_a_record_refuses_a_key_it_does_not_declare(model) -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        model.model_validate({"undeclared_key_us": 1.0})


def test_the_cpu_record_takes_its_declared_keys_and_refuses_one_more() -> None:
    record = HostClockRecord(**CLEAN)
    assert record.stored() == CLEAN                      # no why, no pause: keys never given are not written
    with pytest.raises(ValidationError, match="spins_per_call"):
        HostClockRecord(**CLEAN, spins_per_call=3)      # type: ignore[call-arg]


def test_a_changed_copy_is_checked_like_a_new_record() -> None:
    """pydantic's own copy takes any key unchecked: a record's copy is validated (measure/placed.py
    changes the busy time of a merged record this way)."""
    record = HostClockRecord(**CLEAN)
    busy = record.model_copy(update={"busy_us_median": 7.5})
    assert busy.busy_us_median == 7.5 and busy.stored() == {**CLEAN, "busy_us_median": 7.5}
    assert record.model_copy().stored() == CLEAN
    with pytest.raises(ValidationError, match="spins_per_call"):
        record.model_copy(update={"spins_per_call": 3})
    with pytest.raises(ValidationError, match="cpu_wait_fraction"):
        record.model_copy(update={"cpu_wait_fraction": "high"})


def test_every_key_a_row_timer_records_is_declared_where_the_row_stores_it() -> None:
    """A row stores the settings used and its timer's record flat in `metrics.timing`: each key has
    its meaning there (docs/metrics.md is generated from it), or a new row with it is refused."""
    declared = set(TimingInfo.model_fields)
    recorded = {name for model in ROW_TIMER_RECORDS for name in model.model_fields} - {"busy_samples_us"}
    settings = {f.name for f in fields(TimingSettings)}
    assert not recorded - declared, f"TimingInfo does not declare {sorted(recorded - declared)}"
    assert not settings - declared, f"TimingInfo does not declare {sorted(settings - declared)}"
    assert set(KernelPhases.model_fields) <= set(TimingInfo.model_fields["phases"].annotation.__args__[0].model_fields)


def test_a_real_h200_rows_timing_is_the_settings_plus_a_kernels_record() -> None:
    """tests/run/h200_ok_row.json is a row a `kernels`-mode sweep stored on an H200 (before
    `activity_forced_flushes` existed): every key of its `timing` is a setting or a key of the kernel
    timer's record, and the row loads with none left over."""
    from pathlib import Path

    doc = json.loads((Path(__file__).parents[1] / "run" / "h200_ok_row.json").read_text())
    timing = doc["metrics"]["timing"]
    settings = {f.name for f in fields(TimingSettings)}
    timer_keys = set(timing) - settings
    assert timer_keys <= set(KernelsRecord.model_fields), sorted(timer_keys - set(KernelsRecord.model_fields))
    assert set(KernelsRecord.model_fields) - timer_keys - settings == {"activity_forced_flushes", "busy_samples_us"}
    row = Row.from_json(doc)
    assert row.measured is not None and row.measured.timing is not None and row.measured.timing.older_keys == {}
    assert row.to_json()["metrics"]["timing"] == timing


def test_timing_and_host_parts_are_closed_for_new_rows() -> None:
    with pytest.raises(ValidationError, match="spins_per_call"):
        TimingInfo.model_validate({"mode": "host_clock", "spins_per_call": 3})
    with pytest.raises(ValidationError, match="host_us_per_launch"):
        HostTime.model_validate({"host_us_per_call": 2.0, "host_us_per_launch": 1.0})


GEMM = Case.model_validate({"type": "gemm", "args": {"m": 8, "n": 64, "k": 32, "a": {"dtype": "bf16"},
                                                     "b": {"dtype": "bf16"}, "out": "bf16"}})


def test_a_stored_documents_older_keys_load_and_are_written_back() -> None:
    """A document written by an earlier version can carry keys this one does not declare: they load,
    are kept as they came, and the document round-trips exactly."""
    row = Row(case=GEMM, backend="torch", status="ok", testlist="t", case_index=0,
              metrics={"latency_us": 10.0, "samples_us": [10.0], "timing": {"mode": "kernels"},
                       "host": {"host_us_per_call": 3.0}})
    doc = json.loads(json.dumps(row.to_json()))
    doc["metrics"]["timing"]["retired_key_us"] = 1.25
    doc["metrics"]["host"]["retired_host_key"] = [1, 2]
    back = Row.from_json(doc)
    assert back.measured is not None and back.measured.timing is not None and back.host is not None
    assert back.measured.timing.older_keys == {"retired_key_us": 1.25}
    assert back.host.older_keys == {"retired_host_key": [1, 2]}
    assert back.to_json() == doc
    assert row.measured is not None and row.measured.timing is not None and row.measured.timing.older_keys == {}


# --- the real CPU timer, with the CPU's verdict planted ---------------------------------------------

def _planted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool, int]]:
    """Judge every third sample contended, half its wall time lost; every judgement is kept."""
    seen: list[tuple[int, bool, int]] = []

    def judge(self: ContentionProbe, wall_ns: int, before: CpuStamp, after: CpuStamp) -> tuple[bool, int]:
        contended = len(seen) % 3 == 2
        lost = wall_ns // 2 if contended else 0
        seen.append((wall_ns, contended, lost))
        return contended, lost
    monkeypatch.setattr(ContentionProbe, "judge", judge)
    return seen


SETTINGS = TimingSettings(warmup_calls=2, warmup_floor_s=0.0, first_warmup_floor_s=0.0, noise_target=0.0,
                          min_samples=5, max_samples=24, max_time_s=5.0, timeout_s=10.0, throttle_retries=0)


def test_the_cpu_timer_returns_its_record_with_the_values_it_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _planted(monkeypatch)
    m = HostClockTiming(SETTINGS, prefer_schedstat=False).measure(lambda: sum(range(2000)))
    record = m.details
    assert isinstance(record, HostClockRecord)
    # the sample budget counts every sample: 24 taken, every third (8) judged contended and dropped
    assert len(seen) == SETTINGS.max_samples and m.stop_reason == "max_samples"
    assert m.samples_us == [wall / 1e3 for wall, contended, _ in seen if not contended] and len(m.samples_us) == 16
    assert record.contended_samples_dropped == 8 and record.contended_samples_kept == 0
    assert record.cpu_wait_fraction == pytest.approx(sum(lost for *_, lost in seen) / sum(w for w, *_ in seen),
                                                     rel=1e-12)
    assert record.cpu_contended is False and record.cpu_contended_why is None    # 8 of 24: not most
    assert record.contention_signal == "process_cpu_time" and record.l2_state == "n/a (cpu)" and not record.spin
    assert record.stored() == {"l2_state": "n/a (cpu)", "spin": False, "contention_signal": "process_cpu_time",
                               "contended_samples_dropped": 8, "contended_samples_kept": 0,
                               "cpu_wait_fraction": record.cpu_wait_fraction, "cpu_contended": False}


def test_a_cpu_row_stores_the_timers_record_typed_and_nothing_undeclared(monkeypatch: pytest.MonkeyPatch) -> None:
    from operatorx.measure import Telemetry
    from operatorx.platform import DeviceInfo
    from operatorx.run.case import CaseRunner
    from operatorx.run.config import RunConfig

    seen = _planted(monkeypatch)
    config = RunConfig(testlist="t", backend="torch", device="cpu", timing=SETTINGS)
    runner = CaseRunner(config=config, device=DeviceInfo(kind="cpu", name="test cpu"),
                        timer=HostClockTiming(SETTINGS, prefer_schedstat=False), telemetry=Telemetry(None),
                        peaks=None, testlist="t")
    row = runner.run(GEMM, 0)
    assert row.status == "ok", row.message
    m = row.measured
    assert m is not None and m.timing is not None
    assert len(seen) == SETTINGS.max_samples              # one measurement (no retries on the CPU), no warmup judged
    assert m.samples_us == [wall / 1e3 for wall, contended, _ in seen if not contended]
    assert m.l2_state == "n/a (cpu)" and m.busy_us is None and m.clock == "host"
    timing = row.metrics["timing"]
    assert timing["mode"] == "host_clock" and timing["l2_state"] == "n/a (cpu)" and timing["spin"] is False
    assert timing["contended_samples_dropped"] == 8 and timing["contended_samples_kept"] == 0
    assert timing["cpu_wait_fraction"] == pytest.approx(sum(lost for *_, lost in seen) / sum(w for w, *_ in seen),
                                                        rel=1e-12)
    assert "cpu_contended_why" not in timing and m.timing.older_keys == {}
    assert set(timing) <= set(TimingInfo.model_fields)
    assert Row.from_json(json.loads(json.dumps(row.to_json()))) == row
