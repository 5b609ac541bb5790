"""Measured peaks on a real GPU: physically plausible against the datasheet, quick, leaving no memory
behind, and reaching a row through the worker's job (run/job.py)."""

from __future__ import annotations

import pytest

from operatorx.platform import describe_device, peaks_for
from operatorx.platform.calibrate import ENV_PEAKS_DIR, device_peaks, measure_peaks
from operatorx.run.config import RunConfig
from operatorx.run.job import JobSpec, build_job
from operatorx.spec import Case
from tests.conftest import gemm

pytestmark = pytest.mark.gpu


def test_measured_peaks_are_within_physical_bounds_of_the_datasheet():
    import torch

    device = describe_device("cuda")
    sheet = peaks_for(device.name)
    if sheet is None or sheet.memory_gbps is None:
        pytest.skip(f"{device.name}: no datasheet peaks to compare with")
    from operatorx.platform.calibrate import _gemm_call

    for kind in ("bf16", "fp8"):      # cuBLAS(Lt) keeps one workspace per handle for the process's life
        _gemm_call(kind, 256, 256, 256)()
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    m = measure_peaks()
    assert torch.cuda.memory_allocated() == allocated       # the measurement keeps nothing
    print(f"\n{device.name}: {m.model_dump_json()}")
    assert m.seconds < 4.0, m                              # a worker's start pays this once per stack
    assert m.warm_s is not None and 1.0 <= m.warm_s < 1.5, m    # the clocks were brought up first
    assert m.sm_clock_mhz is None or 0 < m.sm_clock_mhz <= (m.max_sm_clock_mhz or m.sm_clock_mhz), m
    assert 0.5 * sheet.tflops["bf16"] <= m.tflops["bf16"] <= 1.1 * sheet.tflops["bf16"], m
    assert 0.5 * sheet.memory_gbps <= m.memory_gbps <= 1.0 * sheet.memory_gbps, m   # type: ignore[operator]
    if "fp8" in sheet.tflops and torch.cuda.get_device_capability() >= (8, 9):
        assert 0.4 * sheet.tflops["fp8"] <= m.tflops["fp8"] <= 1.1 * sheet.tflops["fp8"], m
        assert m.tflops["fp8"] > 1.3 * m.tflops["bf16"], m     # fp8 runs the tensor cores at twice the rate
    assert m.notes == [], m.notes


def test_worker_job_measures_once_and_rows_use_the_measured_peaks(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_PEAKS_DIR, str(tmp_path / "peaks"))
    config = RunConfig(testlist="t", device="cuda", check_l2=False, profile_kernels=False)
    spec = JobSpec(config=config, run_id="peaks-test", testlist="t")
    job = build_job(spec)
    info = job.info["peaks"]
    assert info["how"] == "measured"
    sheet = peaks_for(describe_device("cuda").name)
    if sheet is not None and sheet.memory_gbps is not None:
        # the H200 measured 792.7 of 989.4 TFLOP/s bf16 (80%) and 4235 of 4800 GB/s (88%) this session:
        # a cold card, a capped clock or a wrong FLOP count falls out of these, as does a faster-than-datasheet
        got = info["measured"]
        assert 0.6 * sheet.tflops["bf16"] <= got["tflops"]["bf16"] <= 1.0 * sheet.tflops["bf16"], got
        assert 0.7 * sheet.memory_gbps <= got["memory_gbps"] <= 1.0 * sheet.memory_gbps, got
    assert len(list((tmp_path / "peaks").iterdir())) == 1
    device = describe_device("cuda")
    assert device_peaks(device, run_id="next")[1]["how"] == "cached"         # the next worker reads it
    assert device_peaks(device, recalibrate=True, run_id="peaks-test")[1]["how"] == "kept from this run"

    row = job.run(Case.model_validate(gemm(m=4096, n=4096, k=4096)), 0)
    assert row.status == "ok", row.message
    rates = row.rates
    assert rates is not None and rates.peak is not None
    measured = info["measured"]
    assert rates.peak.measured_tflops == measured["tflops"]["bf16"]
    assert rates.peak.measured_memory_gbps == measured["memory_gbps"]
    assert rates.peak.tflops == peaks_for(describe_device("cuda").name).tflops["bf16"]   # type: ignore[union-attr]
    assert rates.pct_peak == pytest.approx(100 * rates.tflops / measured["tflops"]["bf16"], rel=1e-6) or \
        rates.pct_peak == pytest.approx(100 * rates.gbps / measured["memory_gbps"], rel=1e-6)
    assert rates.pct_datasheet is not None and rates.pct_datasheet < rates.pct_peak
