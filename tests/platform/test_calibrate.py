"""Measured peaks: the cache (keying, invalidation, corrupt files), --recalibrate, and the row's
rates against measured peaks with the datasheet's beside them. The measuring function is injected:
these run without a GPU (tests/platform/test_calibrate_gpu.py measures a real one)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from operatorx.platform import DeviceInfo, peaks_for
from operatorx.platform.calibrate import (
    ENV_PEAKS_DIR,
    CacheEntry,
    MeasuredPeaks,
    StackKey,
    device_peaks,
    load_or_measure,
    peaks_dir,
    stack_key,
)
from operatorx.result import Row
from operatorx.result_parts import compute_rates
from operatorx.run.config import RunConfig

H200 = DeviceInfo(kind="cuda", name="NVIDIA H200", driver="570.86.15", runtime="cuda 12.8",
                  uuid="GPU-0f3b1c2d-aaaa-bbbb-cccc-1234567890ab")
KEY = StackKey(gpu_name="NVIDIA H200", gpu_uuid=H200.uuid, driver="570.86.15", torch="2.13.0", runtime="cuda 12.8")


class FakeMeasure:
    """Counts its calls; each call returns the next of `bf16` rates (so a re-measure is visible)."""

    def __init__(self, *bf16: float, fail: bool = False) -> None:
        self.rates, self.calls, self.fail = list(bf16) or [812.0], 0, fail

    def __call__(self) -> MeasuredPeaks:
        self.calls += 1
        if self.fail:
            raise RuntimeError("CUDA error: out of memory")
        rate = self.rates[min(self.calls, len(self.rates)) - 1]
        return MeasuredPeaks(tflops={"bf16": rate, "fp8": 2 * rate - 100}, memory_gbps=4310.0,
                             best_shapes={"bf16": "8192x8192x8192", "fp8": "8192x8192x8192"},
                             measured_at="2026-11-30T14:00:00+00:00", seconds=1.2)


def test_peaks_dir_env_and_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_PEAKS_DIR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert peaks_dir() == tmp_path / "xdg" / "operatorx" / "peaks"
    monkeypatch.setenv(ENV_PEAKS_DIR, str(tmp_path / "mine"))
    assert peaks_dir() == tmp_path / "mine"


def test_measured_once_then_cached(tmp_path):
    measure = FakeMeasure(812.0, 790.0)
    first, how1 = load_or_measure(KEY, measure, directory=tmp_path)
    second, how2 = load_or_measure(KEY, measure, directory=tmp_path)
    assert (how1, how2) == ("measured", "cached") and measure.calls == 1
    assert first == second and second is not None and second.tflops["bf16"] == 812.0
    stored = CacheEntry.model_validate_json((tmp_path / KEY.file_name()).read_text())
    assert stored.key == KEY and stored.peaks.memory_gbps == 4310.0
    assert KEY.file_name().startswith("GPU-0f3b1c2d-aaaa-bbbb-cccc-1234567890ab-")


@pytest.mark.parametrize("change", [{"driver": "575.51.03"}, {"torch": "2.14.0"}, {"runtime": "cuda 13.0"},
                                    {"gpu_uuid": "GPU-other"}, {"gpu_name": "NVIDIA H100 80GB HBM3"},
                                    {"method": 99}])
def test_any_part_of_the_key_changing_measures_again(tmp_path, change):
    measure = FakeMeasure(812.0, 790.0)
    load_or_measure(KEY, measure, directory=tmp_path)
    other = KEY.model_copy(update=change)
    assert other.file_name() != KEY.file_name()
    peaks, how = load_or_measure(other, measure, directory=tmp_path)
    assert how == "measured" and measure.calls == 2 and peaks is not None and peaks.tflops["bf16"] == 790.0
    assert load_or_measure(KEY, measure, directory=tmp_path)[0].tflops["bf16"] == 812.0    # both stacks kept


def test_recalibrate_measures_again_once_per_run(tmp_path):
    measure = FakeMeasure(812.0, 805.0, 700.0)
    load_or_measure(KEY, measure, directory=tmp_path, run_id="run-1")
    peaks, how = load_or_measure(KEY, measure, directory=tmp_path, recalibrate=True, run_id="run-2")
    assert how == "recalibrated" and measure.calls == 2 and peaks is not None and peaks.tflops["bf16"] == 805.0
    # a worker of the same run started again (after a leak or a crash) keeps the run's peaks
    again, how = load_or_measure(KEY, measure, directory=tmp_path, recalibrate=True, run_id="run-2")
    assert how == "kept from this run" and measure.calls == 2 and again == peaks and again.run_id == "run-2"
    # a later run without --recalibrate reads what the recalibration wrote
    assert load_or_measure(KEY, measure, directory=tmp_path, run_id="run-3") == (peaks, "cached")


@pytest.mark.parametrize("content", ["{not json", json.dumps({"key": "x"}), "",
                                     json.dumps({"key": KEY.model_dump(), "peaks": {"tflops": {"bf16": -5.0},
                                                 "memory_gbps": 1.0, "best_shapes": {}, "measured_at": "t",
                                                 "seconds": 1.0}}),
                                     # binary garbage (a disk error, a truncated copy): not even UTF-8
                                     b"\xff\xfe\x00\x81\x9c garbage \xc3", b'{"key": "\xff\xfe"}'])
def test_corrupt_cache_is_measured_again_with_one_warning_line(tmp_path, capsys, content):
    path = tmp_path / KEY.file_name()
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    measure = FakeMeasure(812.0)
    peaks, how = load_or_measure(KEY, measure, directory=tmp_path)
    assert how == "unreadable cache, measured" and measure.calls == 1 and peaks is not None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("operatorx: warning: peaks cache ") and KEY.file_name() in err and "measuring again" in err
    assert load_or_measure(KEY, measure, directory=tmp_path) == (peaks, "cached")     # the file was rewritten


def test_an_entry_of_another_stack_in_the_file_is_not_used(tmp_path, capsys):
    other = KEY.model_copy(update={"driver": "1.0"})
    entry = CacheEntry(key=other, peaks=FakeMeasure(500.0)())
    (tmp_path / KEY.file_name()).write_text(entry.model_dump_json())
    peaks, how = load_or_measure(KEY, FakeMeasure(812.0), directory=tmp_path)
    assert peaks is not None and peaks.tflops["bf16"] == 812.0 and how == "unreadable cache, measured"
    assert capsys.readouterr().err.count("\n") == 1


def test_measuring_that_fails_keeps_the_datasheet_with_one_warning(tmp_path, capsys):
    peaks, info = device_peaks(H200, measure=FakeMeasure(fail=True), directory=tmp_path)
    assert peaks == peaks_for("NVIDIA H200") and info["how"] == "not measured" and info["measured"] is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "measuring failed (RuntimeError: CUDA error: out of memory)" in err
    assert not (tmp_path / stack_key(H200).file_name()).exists()      # nothing cached: the next worker tries again


def test_unwritable_cache_still_gives_the_peaks(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    peaks, how = load_or_measure(KEY, FakeMeasure(812.0), directory=blocker / "peaks")
    assert how == "measured" and peaks is not None and peaks.tflops["bf16"] == 812.0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write (Not a directory); the peaks hold for this run only" in err


def test_cpu_device_has_no_measured_peaks(tmp_path):
    cpu = DeviceInfo(kind="cpu", name="x86_64", cpu_threads=2)
    measure = FakeMeasure()
    assert device_peaks(cpu, measure=measure, directory=tmp_path)[0] is None and measure.calls == 0
    assert list(tmp_path.iterdir()) == []


def test_counters_child_reads_the_cache_but_never_measures(tmp_path):
    measure = FakeMeasure(812.0)
    peaks, info = device_peaks(H200, measure=measure, measure_now=False, directory=tmp_path)
    assert measure.calls == 0 and info["how"] == "not measured" and peaks == peaks_for("NVIDIA H200")
    device_peaks(H200, measure=measure, directory=tmp_path)
    peaks, info = device_peaks(H200, measure=measure, measure_now=False, directory=tmp_path)
    assert measure.calls == 1 and info["how"] == "cached" and peaks is not None
    assert peaks.measured_tflops == {"bf16": 812.0, "fp8": 1524.0}


def test_rates_use_measured_peaks_and_keep_the_datasheet(tmp_path):
    peaks, info = device_peaks(H200, measure=FakeMeasure(812.0), directory=tmp_path, run_id="r1")
    assert peaks is not None and info["how"] == "measured" and info["measured"]["run_id"] == "r1"
    assert info["datasheet"] == {"tflops": peaks_for("NVIDIA H200").tflops, "memory_gbps": 4800.0}
    bf16 = peaks.part("bf16")
    assert (bf16.tflops, bf16.memory_gbps, bf16.measured_tflops, bf16.measured_memory_gbps) == \
        (989.4, 4800.0, 812.0, 4310.0)
    assert bf16.source == ("measured 2026-11-30 on this GPU (operatorx calibrate v3); "
                           "datasheet beside: vendor datasheet, dense")
    # 8192³ bf16 in 1.5 ms: 733 TFLOP/s, 90.3% of the measured 812 and 74.1% of the datasheet 989.4
    flops, nbytes = 2 * 8192 ** 3, 3 * 8192 * 8192 * 2
    rates = compute_rates(flops, nbytes, 1500.0, bf16)
    assert rates.tflops == pytest.approx(733.0, abs=0.1)
    assert rates.pct_peak == pytest.approx(100 * flops / 1500e-6 / 812e12, rel=1e-9)
    assert rates.pct_peak == pytest.approx(90.27, abs=0.01)
    assert rates.pct_datasheet == pytest.approx(74.09, abs=0.01)
    # memory-bound: a copy-like case at 3.9 TB/s is 90.5% of the measured 4310 GB/s, 81.3% of 4800
    mem = compute_rates(10 ** 6, 3_900_000_000, 1000.0, bf16)
    assert mem.pct_peak == pytest.approx(90.49, abs=0.01) and mem.pct_datasheet == pytest.approx(81.25, abs=0.01)


def test_class_not_measured_takes_the_datasheet_compute_and_measured_memory(tmp_path):
    peaks, _ = device_peaks(H200, measure=FakeMeasure(812.0), directory=tmp_path)
    assert peaks is not None
    fp32 = peaks.part("fp32")
    assert fp32.measured_tflops is None and fp32.measured_memory_gbps == 4310.0 and fp32.tflops == 66.9
    assert fp32.source == ("memory measured 2026-11-30 on this GPU (operatorx calibrate v3); "
                           "compute: vendor datasheet, dense")
    rates = compute_rates(66_900_000_000, 10, 1000.0, fp32)         # 66.9 TFLOP/s: 100% of the datasheet fp32
    assert rates.pct_peak == pytest.approx(100.0) and rates.pct_datasheet == pytest.approx(100.0)


def test_datasheet_only_rows_are_as_before():
    part = peaks_for("NVIDIA H200").part("bf16")
    assert part.dump() == {"compute_class": "bf16", "tflops": 989.4, "memory_gbps": 4800.0,
                           "source": "vendor datasheet, dense"}
    rates = compute_rates(2 * 8192 ** 3, 0, 1500.0, part)
    assert "pct_datasheet" not in rates.dump() and rates.pct_peak == pytest.approx(74.09, abs=0.01)


def test_unknown_gpu_gets_its_measured_peaks_alone(tmp_path):
    card = replace(H200, name="NVIDIA Future 9000", uuid="GPU-future")
    peaks, _ = device_peaks(card, measure=FakeMeasure(812.0), directory=tmp_path)
    assert peaks is not None
    part = peaks.part("bf16")
    assert part.tflops is None and part.memory_gbps is None and part.measured_tflops == 812.0
    assert compute_rates(812 * 10 ** 6, 0, 1.0, part).pct_peak == pytest.approx(100.0)


def test_row_with_measured_peaks_round_trips(tmp_path):
    peaks, _ = device_peaks(H200, measure=FakeMeasure(812.0), directory=tmp_path)
    assert peaks is not None
    rates = compute_rates(2 * 8192 ** 3, 3 * 8192 * 8192 * 2, 1500.0, peaks.part("bf16"))
    row = Row.from_json({"op": {"type": "gemm", "sources": [], "args": {
        "m": 8192, "n": 8192, "k": 8192, "a": {"dtype": "bf16"}, "b": {"dtype": "bf16"}, "out": "bf16"},
        "backend": "torch"}, "status": "ok", "testlist": "t", "case_index": 0,
        "metrics": {"latency_us": 1500.0, **rates.dump()}})
    again = Row.from_json(json.loads(json.dumps(row.to_json())))
    assert again == row and again.metrics["peak"]["measured_tflops"] == 812.0
    assert again.metrics["pct_datasheet"] == pytest.approx(74.09, abs=0.01)
    busy = again.rates_at("busy")
    assert busy is not None and busy.pct_peak == pytest.approx(90.27, abs=0.01)


def test_recalibrate_travels_with_the_run_config():
    config = RunConfig(testlist="gemm_perf", recalibrate=True)
    assert RunConfig.from_json(json.loads(json.dumps(config.to_json()))).recalibrate is True
    assert RunConfig.from_json({"testlist": "x"}).recalibrate is False       # a stored older run


def test_cache_file_is_readable_json(tmp_path):
    load_or_measure(KEY, FakeMeasure(812.0), directory=tmp_path)
    data = json.loads((tmp_path / KEY.file_name()).read_text())
    assert data["key"]["driver"] == "570.86.15" and data["peaks"]["tflops"]["bf16"] == 812.0
    assert [p.name for p in Path(tmp_path).iterdir()] == [KEY.file_name()]        # no temporary file left


def test_importing_the_calibration_touches_no_torch():
    """The sweep's parent imports run/job.py; it must never create a CUDA context (not even import torch)."""
    import subprocess
    import sys

    code = ("import sys, operatorx.platform.calibrate, operatorx.run.job, operatorx.cli.run; "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-2000:]


def test_cli_recalibrate_is_stored_with_the_run_and_a_cpu_run_measures_nothing(tmp_path, monkeypatch):
    import subprocess
    import sys

    monkeypatch.setenv(ENV_PEAKS_DIR, str(tmp_path / "peaks"))
    cmd = [sys.executable, "-m", "operatorx", "run", "-t", "gemm_perf", "--device", "cpu", "--limit", "1",
           "--max-time", "0.05", "--min-samples", "5", "--warmup-calls", "1", "--executor", "inline",
           "--recalibrate", "--db", str(tmp_path / "r.db"), "--results-dir", str(tmp_path / "docs")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    doc = json.loads(next((tmp_path / "docs").glob("*.json")).read_text())
    assert doc["run"]["job"]["config"]["recalibrate"] is True and doc["run"]["peaks"] is None
    assert all("peak" not in (r.get("metrics") or {}) for r in doc["rows"])
    assert not (tmp_path / "peaks").exists()


class _FakeClock:
    """`time` for calibrate._warm on a virtual clock: a loaded CI machine oversleeps a real 20 ms
    sleep by more than the few ms a real-clock test could leave it."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.sleeps_s: list[float] = []

    def perf_counter(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.sleeps_s.append(seconds)
        self.now_s += seconds


def test_warmup_runs_synchronized_calls_for_its_wall_time(monkeypatch):
    """The GPU warmup before the first timed shape (calibrate._warm), with a CPU stand-in for the GEMM:
    every call is synchronized, rests as long as it took (half the time busy keeps the card out of
    its power cap), and the loop lasts its seconds, however fast or slow a call is."""
    import operatorx.platform.calibrate as calibrate
    from operatorx.platform.calibrate import WARM_S, _warm

    events: list[str] = []
    calls, seconds = _warm(lambda: events.append("call"), lambda: events.append("sync"), 0.05)
    assert seconds >= 0.05 and calls == len(events) // 2 >= 2
    assert events == ["call", "sync"] * calls
    clock = _FakeClock()
    monkeypatch.setattr(calibrate, "time", clock)

    def call_of_20_ms() -> None:
        clock.now_s += 0.02
    slow = _warm(call_of_20_ms, lambda: None, 0.05)     # 20 ms calls, each rested 20 ms: 2 calls, 80 ms
    assert slow == (2, pytest.approx(0.08)) and clock.sleeps_s == [pytest.approx(0.02)] * 2
    assert _warm(lambda: None, lambda: None, 0.0)[0] == 1          # at least one call, even with no time
    assert WARM_S == 1.0


def test_a_cache_file_of_the_previous_method_is_measured_again(tmp_path):
    """Peaks of method v1 (measured after 3 warmup calls, perhaps on a cold card) are never reused."""
    old = StackKey(**{**KEY.model_dump(), "method": 1})
    load_or_measure(old, FakeMeasure(700.0), directory=tmp_path)
    measure = FakeMeasure(812.0)
    peaks, how = load_or_measure(KEY, measure, directory=tmp_path)
    assert KEY.method == 3 and how == "measured" and peaks is not None and peaks.tflops["bf16"] == 812.0
    # and a v1 entry's fields (no warmup or clock) still parse: they read as unknown
    data = json.loads((tmp_path / old.file_name()).read_text())
    for field in ("warm_s", "sm_clock_mhz", "max_sm_clock_mhz"):
        del data["peaks"][field]
    entry = CacheEntry.model_validate(data)
    assert entry.peaks.warm_s is None and entry.peaks.sm_clock_mhz is None and entry.peaks.tflops["bf16"] == 700.0
