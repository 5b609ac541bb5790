"""VllmEnv's process-wide workspaces: what a released case gives back (CPU; vLLM and CUDA stood in for)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from operatorx.backends.vllm.env import VllmEnv, clear_blas_workspaces


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """vLLM's workspace module and torch's cuBLAS workspace cache, recording what is done to them."""
    done: list[str] = []
    workspace = types.ModuleType("vllm.v1.worker.workspace")
    workspace.reset_workspace_manager = lambda: done.append("vllm reset")  # type: ignore[attr-defined]
    workspace.init_workspace_manager = lambda device: done.append(f"vllm init {device}")  # type: ignore[attr-defined]
    for name in ("vllm", "vllm.v1", "vllm.v1.worker"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.workspace", workspace)
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: done.append("cublas cleared"),
                        raising=False)
    return done


class _Env:
    """VllmEnv's workspace methods on a bare object (VllmEnv() itself needs vLLM)."""

    def __init__(self) -> None:
        self.workspace_holders = 0
        self.hold_workspace = VllmEnv.hold_workspace.__get__(self)
        self.drop_workspace = VllmEnv.drop_workspace.__get__(self)


def test_drop_gives_back_vllms_workspace_then_the_cublas_workspaces(calls: list[str]) -> None:
    """A DeepSeek-V4 decode's aux GEMM streams each left a 32 MiB cuBLAS workspace behind (benchmarks §33)."""
    _Env().drop_workspace()
    assert calls == ["vllm reset", "vllm init cuda", "cublas cleared"]


def test_cublas_workspaces_are_kept_while_a_placement_copy_still_holds(calls: list[str]) -> None:
    env = _Env()
    first, second = env.hold_workspace(), env.hold_workspace()
    first()
    assert calls == []                        # the second copy's graph may replay the workspace it captured
    second()
    second()                                  # a second let-go of one holder counts once
    assert calls == ["vllm reset", "vllm init cuda", "cublas cleared"] and env.workspace_holders == 0


def test_clear_is_a_no_op_on_a_torch_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch._C, "_cuda_clearCublasWorkspaces", raising=False)
    clear_blas_workspaces()                   # the CPU build has no cuBLAS: nothing to free, no error
    assert not hasattr(torch._C, "_cuda_clearCublasWorkspaces")
