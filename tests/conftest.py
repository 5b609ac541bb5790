"""Shared fixtures; `gpu` tests skip cleanly where torch sees no CUDA device."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


BF16 = {"dtype": "bf16"}


def gemm(m: int = 4, n: int = 256, k: int = 256, **extra: Any) -> dict[str, Any]:
    args = {"m": m, "n": n, "k": k, "a": BF16, "b": BF16, "out": "bf16", **extra}
    return {"type": "gemm", "args": args, "sources": []}


def fp8_block(m: int = 4, n: int = 256, k: int = 256, sd: str = "fp32") -> dict[str, Any]:
    return {"type": "gemm", "sources": [], "args": {
        "m": m, "n": n, "k": k, "out": "bf16",
        "a": {"dtype": "e4m3", "scale": {"dtype": sd, "static": False, "group": [1, 128]}},
        "b": {"dtype": "e4m3", "scale": {"dtype": sd, "static": True, "group": [128, 128]}}}}


def moe(**over: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "tokens": 8, "hidden": 256,
        "experts": {"num": 8, "top_k": 2, "inter": 128, "w1": BF16, "w2": BF16},
        "router": {"gate": {"dtype": "bf16"}, "scoring": "softmax", "select": {"kind": "topk"}},
        "activation": {"kind": "silu"},
        "routing": {"distribution": "natural", "seed": 0},
    }
    args.update(over)
    return {"type": "moe", "args": args, "sources": []}


@pytest.fixture
def write_testlist(tmp_path: Path):
    def _write(cases: Any, name: str = "list.json") -> Path:
        p = tmp_path / name
        p.write_text(cases if isinstance(cases, str) else json.dumps(cases))
        return p
    return _write
