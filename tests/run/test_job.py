"""The worker's job start: what a backend warms before the first case (run/job.py)."""

from __future__ import annotations

import pytest

from operatorx.run.job import _launch_gap, _warm_backend


def test_the_torch_backend_warms_nothing_on_the_cpu():
    assert _warm_backend("torch", "cpu") is None


def test_a_warmup_that_fails_is_a_reason_not_an_exception(monkeypatch):
    import torch

    def refuse(*args, **kwargs):
        raise RuntimeError("CUDA error: no kernel image is available for execution on the device")

    monkeypatch.setattr(torch, "zeros", refuse)
    assert _warm_backend("torch", "cuda") == ("RuntimeError: CUDA error: no kernel image is available for "
                                              "execution on the device")


@pytest.mark.gpu
def test_the_torch_backend_warms_cublas_on_the_gpu():
    import torch

    assert _warm_backend("torch", "cuda") is None
    torch.cuda.synchronize()


def test_a_launch_gap_probe_that_fails_is_said_and_the_worker_goes_on(monkeypatch):
    from operatorx.measure import launch_gap
    from operatorx.measure.launch_gap import LaunchGap

    def broken(sm_clock_hz, released):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED\nmore")

    monkeypatch.setattr(launch_gap, "measure_launch_gap", broken)
    assert _launch_gap(2e9, True) == {"error": "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"}    # its first line
    monkeypatch.setattr(launch_gap, "measure_launch_gap", lambda hz, released: None)
    assert _launch_gap(2e9, True) == {
        "error": "no probe call counted (no kernel recorded, or the host late for every call)"}
    seen = []
    monkeypatch.setattr(launch_gap, "measure_launch_gap",
                        lambda hz, released: seen.append(released) or LaunchGap(1.10412, 0.896, 120))
    assert _launch_gap(2e9, False) == {"gap_us": 1.1041, "kernel_us": 0.896, "boundaries": 120}
    assert seen == [False]          # --no-spin: the probe builds no released wait either
