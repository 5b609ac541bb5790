"""Which GPUs a sweep uses, decided in the parent without CUDA."""

from __future__ import annotations

import pytest

from operatorx.run.gpus import parse_gpus, visible_gpus, worker_env


def test_cuda_visible_devices_narrows_and_orders(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1, GPU-abc")
    assert visible_gpus() == ["3", "1", "GPU-abc"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []


def test_each_worker_sees_one_gpu_by_its_entry(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    env = worker_env("1")
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")          # the user's own order is kept as given
    assert "CUDA_DEVICE_ORDER" not in worker_env("6")
    cpu = worker_env(None, cpu_share=2)
    assert cpu["OMP_NUM_THREADS"] == "2" and cpu["CUDA_VISIBLE_DEVICES"] == "5,6"


@pytest.mark.parametrize(("text", "want"), [(None, None), ("all", None), ("0", (0,)), ("1,0", (1, 0))])
def test_gpus_option(text, want):
    assert parse_gpus(text) == want


@pytest.mark.parametrize("text", ["x", "0,0", "-1", ","])
def test_bad_gpus_are_refused(text):
    with pytest.raises(ValueError, match="--gpus"):
        parse_gpus(text)


def test_a_worker_on_an_image_without_bytecode_compiles_into_the_cache_tree(monkeypatch, tmp_path):
    from operatorx import bytecode_cache

    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.delenv("OPERATORX_BYTECODE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(bytecode_cache, "_ships_bytecode", lambda package: False)    # torch as such images ship it
    env = worker_env("0")
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "operatorx" / "pycache")
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["CUDA_VISIBLE_DEVICES"] == "0"
    monkeypatch.setenv("OPERATORX_BYTECODE_CACHE", "0")
    assert worker_env("0")["PYTHONDONTWRITEBYTECODE"] == "1"
