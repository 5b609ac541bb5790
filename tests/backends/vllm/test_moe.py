"""VllmMoe's release order, on CPU: vLLM's modular-kernel workspace goes back after the block, once no live
case holds it (backends/vllm/moe.py)."""

from __future__ import annotations

from typing import Any

import pytest

from operatorx.backends.vllm import moe as vllm_moe
from operatorx.backends.vllm import moe_prepare
from operatorx.backends.vllm.env import VllmEnv
from operatorx.backends.vllm.moe import VllmMoe
from tests.backends.vllm.cases import WorkspaceRecorder, moe_case


class _Block:
    """A built MoE block with nothing to run: what release reaches."""

    graph = None
    monolithic = False

    def __init__(self, rec: WorkspaceRecorder, n: int) -> None:
        self.rec, self.n = rec, n
        self.metadata: dict[str, Any] = {"experts_hit": 4}

    def decomposed(self) -> None:
        raise AssertionError("not called on release")

    def forget(self) -> None:
        self.rec.events.append(f"block {self.n} forgotten")


class _Builds(WorkspaceRecorder):
    """VllmEnv's stand-in, and which builds (n-th, from 0) fail."""

    def __init__(self) -> None:
        super().__init__()
        self.fail: set[int] = set()


@pytest.fixture
def rec(monkeypatch) -> _Builds:
    """VllmMoe's build stands in, VllmEnv is the recorder."""
    rec = _Builds()
    builds = iter(range(100))

    def build_moe(case: Any, args: Any, plan: Any, stack: Any) -> _Block:
        n = next(builds)
        stack.callback(rec.events.append, f"module {n} released")
        if n in rec.fail:
            raise RuntimeError(f"build {n} failed")
        return _Block(rec, n)

    monkeypatch.setattr(VllmEnv, "get", classmethod(lambda cls: rec))
    monkeypatch.setattr(VllmMoe, "plan_or_refuse", lambda self, case: None)
    monkeypatch.setattr(vllm_moe, "require_memory", lambda needed_bytes, device: None)
    monkeypatch.setattr(moe_prepare, "build_moe", build_moe)
    return rec


def test_the_workspace_goes_back_after_the_block(rec: _Builds) -> None:
    """Release closes the block's stack, then gives the workspace back: it grew to the case's largest batch
    and a server would keep it, a benchmark's next case must not inherit it."""
    prepared = VllmMoe().prepare(moe_case("bf16"), "cuda")
    assert rec.events == [] and rec.workspace_holders == 1
    assert prepared.release is not None
    prepared.release()
    assert rec.events == ["block 0 forgotten", "module 0 released", "workspace dropped"]
    assert rec.workspace_holders == 0


def test_a_failed_copy_leaves_the_workspace_to_the_live_ones(rec: _Builds) -> None:
    """--placements holds copies of one case together, their graphs replaying views of one workspace: a copy
    whose build fails lets go of it without freeing it under them; the last release frees it."""
    rec.fail.add(1)
    backend = VllmMoe()
    first = backend.prepare(moe_case("bf16"), "cuda")
    with pytest.raises(RuntimeError, match="build 1 failed"):
        backend.prepare(moe_case("bf16"), "cuda")
    assert rec.events == ["module 1 released"] and rec.workspace_holders == 1
    assert first.release is not None
    first.release()
    assert rec.events[-1] == "workspace dropped" and rec.workspace_holders == 0
