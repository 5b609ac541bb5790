"""The worker's job start: what a backend warms before the first case (run/job.py)."""

from __future__ import annotations

import pytest

from operatorx.run.job import _warm_backend


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
