"""CUDA paths of the torch MoE backend (skipped without a GPU): bf16 grouped_mm, e4m3 row-wise
scaled_grouped_mm on sm90, and the refusals that depend on the device."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from operatorx.backends.torch.moe import TorchMoe
from operatorx.spec import Case
from tests.backends.memory_left import memory_left_after_release
from tests.backends.torch.test_moe_layer import (
    BF16,
    DEEPSEEK_ROUTER,
    E4M3_128,
    E4M3_CHAN,
    E4M3_ROW,
    MXFP4,
    VARIANTS,
    E4M3_1x128,
    _experts,
    case,
)

pytestmark = pytest.mark.gpu


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def _run(c: Case) -> dict[str, Any]:
    backend = TorchMoe()
    assert backend.supports(c, "cuda") is None, backend.supports(c, "cuda")
    p = backend.prepare(c, "cuda")
    check = p.check()
    assert check.ok, check
    out = p.fn()
    torch.cuda.synchronize()
    assert out.is_cuda and torch.isfinite(out.float()).all()
    assert p.release is not None
    meta = dict(p.metadata)
    p.release()
    return meta


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_small_bf16_variants_on_cuda(name: str) -> None:
    meta = _run(case(**VARIANTS[name]))
    assert "grouped_mm" in meta["calls"]["experts"]


QWEN3 = {"hidden": 4096, "experts": {"num": 128, "top_k": 8, "inter": 384, "w1": BF16, "w2": BF16},
         "router": {"gate": {"dtype": "bf16"}, "scoring": "softmax", "select": {"kind": "topk"}, "renormalize": True}}
DEEPSEEK_BF16 = {"hidden": 7168, "experts": {"num": 256, "top_k": 8, "inter": 256, "w1": BF16, "w2": BF16},
                 "router": {**DEEPSEEK_ROUTER, "select": {"kind": "grouped_topk", "groups": 8, "topk_groups": 4}},
                 "shared": {"count": 1, "inter": 256, "w1": BF16, "w2": BF16}}


@pytest.mark.parametrize("tokens", [1, 64, 2048])
@pytest.mark.parametrize("dist", ["natural", "balanced", "single_hot", {"kind": "zipf", "s": 1.2}])
def test_real_shapes_on_cuda(tokens: int, dist: Any) -> None:
    for shape in (QWEN3, DEEPSEEK_BF16):
        meta = _run(case(tokens=tokens, routing={"distribution": dist, "seed": 0}, **shape))
        assert sum(meta["expert_load"]) == tokens * shape["experts"]["top_k"]


FP8_ROWWISE = {"hidden": 512, "experts": _experts(num=16, top_k=4, inter=256, a1=E4M3_ROW, w1=E4M3_CHAN,
                                                  w2=E4M3_CHAN, a2=E4M3_ROW),
               "router": DEEPSEEK_ROUTER,
               "shared": {"count": 1, "inter": 256, "a1": E4M3_ROW, "w1": E4M3_CHAN, "w2": E4M3_CHAN}}


@pytest.mark.skipif(not _sm90(), reason="e4m3 row-wise scaled_grouped_mm is wired for sm90")
@pytest.mark.parametrize("tokens", [1, 37, 512])
def test_fp8_rowwise_experts_on_sm90(tokens: int) -> None:
    meta = _run(case(tokens=tokens, **FP8_ROWWISE))
    assert "scaled_grouped_mm" in meta["calls"]["experts"]
    assert "scaled_mm" in meta["calls"]["shared"]


def test_block_fp8_and_fp4_are_refused_on_cuda() -> None:
    block = case(experts=_experts(a1=E4M3_1x128, w1=E4M3_128, w2=E4M3_128, a2=E4M3_1x128))
    reason = TorchMoe().supports(block, "cuda")
    assert reason is not None and ("block" in reason or "sm90" in reason)
    fp4 = case(experts=_experts(w1=MXFP4, w2=MXFP4))
    reason = TorchMoe().supports(fp4, "cuda")
    assert reason is not None and "fp4" in reason


def test_shipped_testlist_cases_end_in_a_status(tmp_path: Any) -> None:
    """Every moe_small case either is refused with a reason or prepares and checks on this GPU (T ≤ 64)."""
    import json
    from importlib.resources import files

    cases = json.loads(files("operatorx.testlists").joinpath("moe_small.json").read_text())
    backend = TorchMoe()
    for raw in cases:
        c = Case.model_validate(raw)
        if c.args.tokens > 64:
            continue
        reason = backend.supports(c, "cuda")
        if reason is not None:
            assert reason.strip()
            continue
        p = backend.prepare(c, "cuda")
        assert p.check().ok, raw["sources"]
        p.release()
        torch.cuda.empty_cache()


def test_moe_and_gemm_give_their_memory_back_over_20_cases() -> None:
    """Issue 14 item 4, for the torch backend: after release, torch's allocated device memory is
    where it was before prepare, case after case, with no garbage collection in between."""
    from operatorx.backends.torch.gemm import TorchGemm

    moe_cases = [case(tokens=t, routing={"distribution": d, "seed": 0}, **shape)
                 for shape in (QWEN3, DEEPSEEK_BF16) for t in (1, 64, 512, 2048) for d in ("natural", "balanced")]
    moe_cases += [case(tokens=t, **FP8_ROWWISE) for t in (1, 64, 512, 2048)] if _sm90() else []
    gemm_cases = [Case.model_validate({"type": "gemm", "args": {"m": m, "n": n, "k": 4096, "a": {"dtype": "bf16"},
                                                                 "b": {"dtype": "bf16"}, "out": "bf16"}})
                  for m in (1, 64, 4096, 8192) for n in (1024, 4096, 14336, 2048, 7168)]
    _run(moe_cases[0])                                  # first use of the process: cuBLAS handles, kernels

    def run_and_release(c: Case) -> None:
        if c.type == "moe":
            _run(c)                                     # _run releases
            return
        p = TorchGemm().prepare(c, "cuda")
        assert p.check().ok and p.release is not None
        p.fn()
        p.release()

    left = memory_left_after_release(moe_cases[:20] + gemm_cases[:20], run_and_release)
    assert max(left.values()) < 1 * 2**20, left
