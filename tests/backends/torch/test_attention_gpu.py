"""CUDA paths of the torch gqa and mla backends (skipped without a GPU): checkpoint-sized modules in
decode and prefill against the fp32 reference, SDPA's fused kernels taken, nothing left after release."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from operatorx.backends.torch.attention import TorchGqa, TorchMla
from operatorx.spec import Case
from tests.backends.memory_left import memory_left_after_release

pytestmark = pytest.mark.gpu

#: Qwen3-30B-A3B's attention (32 q heads over 4 KV heads of 128, q/k norm) and DeepSeek-V3's MLA with its YaRN.
QWEN3 = {"hidden": 2048, "q_heads": 32, "kv_heads": 4, "head_dim": 128, "rope_dim": 128, "rope_theta": 1e6,
         "qk_norm": True}
DSV3 = {"hidden": 7168, "heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "nope": 128, "rope_dim": 64, "v": 128,
        "rope_theta": 10000.0, "rope_scaling": {"type": "yarn", "factor": 40, "original_max": 4096, "beta_fast": 32,
                                                "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}
GROUPS = {
    "decode": [{"count": 16, "q": 1, "ctx": 4096}],
    "ragged-decode": [{"count": 8, "q": 1, "ctx": {"dist": "uniform", "min": 100, "max": 8000}}],
    "prefill": [{"count": 1, "q": 1024, "ctx": 0}],
    "chunked-prefill": [{"count": 1, "q": 512, "ctx": 2048}, {"count": 4, "q": 1, "ctx": 1000}],
}


def _case(op: str, groups: list[dict[str, Any]]) -> Case:
    args = {**(QWEN3 if op == "gqa" else DSV3), "batch": {"groups": groups, "pages": "shuffled", "seed": 1}}
    return Case.model_validate({"type": op, "args": args, "sources": ["org/model/self_attn"]})


def _kernels(fn: Any) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("groups", list(GROUPS), ids=list(GROUPS))
@pytest.mark.parametrize("op", ["gqa", "mla"])
def test_checkpoint_sized_modules_match_the_reference_on_cuda(op, groups):
    case = _case(op, GROUPS[groups])
    backend = TorchGqa() if op == "gqa" else TorchMla()
    assert backend.supports(case, "cuda") is None
    p = backend.prepare(case, "cuda")
    check = p.check()
    assert check.ok and check.rel_error < 1e-2, check
    names = " ".join(_kernels(p.fn)).lower()
    # SDPA on bf16 CUDA takes flash or memory-efficient attention, never the unfused math path
    assert any(w in names for w in ("flash", "fmha", "efficient", "sdpa")), names[:2000]
    p.release()


def test_released_attention_cases_leave_nothing_behind():
    cases = [_case("gqa", GROUPS["chunked-prefill"]), _case("mla", GROUPS["decode"])]

    def run(case: Case) -> None:
        backend = TorchGqa() if case.type == "gqa" else TorchMla()
        p = backend.prepare(case, "cuda")
        p.fn()
        p.release()
        del p

    left = memory_left_after_release(cases, run)
    assert all(v == 0 for v in left.values()), left


_ACT = {"dtype": "e4m3", "scale": {"dtype": "ue8m0", "group": [1, 128], "static": False}}
_BLOCK_W = {"dtype": "e4m3", "scale": {"dtype": "ue8m0", "group": [128, 128], "static": True}}
_NAMES = {"gqa": ("q_proj", "k_proj", "v_proj", "o_proj"),
          "mla": ("q_a_proj", "kv_a_proj_with_mqa", "q_b_proj", "kv_b_proj", "o_proj")}


@pytest.mark.parametrize("groups", ["decode", "chunked-prefill"])
@pytest.mark.parametrize("op", ["gqa", "mla"])
def test_block_fp8_projections_run_scaled_mm_and_match_the_reference(op, groups):
    """DeepSeek-V3's / an FP8 Qwen3's checkpoint form: every projection block FP8 through F.scaled_mm."""
    case = _case(op, GROUPS[groups])
    args = {**case.args_dict(), "proj": {n: {"a": _ACT, "b": _BLOCK_W} for n in _NAMES[op]}}
    if op == "mla":
        args["heads"] = 16                       # one rank of tp8
    case = Case.model_validate({"type": op, "args": args, "sources": ["org/model/self_attn"]})
    backend = TorchGqa() if op == "gqa" else TorchMla()
    assert backend.supports(case, "cuda") is None
    p = backend.prepare(case, "cuda")
    check = p.check()
    assert check.ok, check
    assert "block-FP8 projections" in check.reference
    assert "scaled_mm" in p.metadata["calls"]["projections"]
    names = " ".join(_kernels(p.fn)).lower()
    assert "gemm" in names or "sm90" in names or "cutlass" in names, names[:2000]
    p.release()


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 16, 8193])
def test_a_block_fp8_projection_takes_any_row_count(rows):
    """cuBLASLt refused an 8193-row block-FP8 call (the MLA up-projection of 8192 cached latents and a new
    token): the projection pads to SCALE_ROWS and drops the pad's rows."""
    from operatorx.backends.torch.attention.proj import make_projection
    from operatorx.spec.operand import Scale

    gen = torch.Generator(device="cuda").manual_seed(rows)
    w = torch.randn(512, 256, generator=gen, device="cuda").div(16).to(torch.bfloat16)
    x = torch.randn(rows, 256, generator=gen, device="cuda").to(torch.bfloat16)
    proj = make_projection(w, "fp8_block", Scale.model_validate(_ACT["scale"]),
                           Scale.model_validate(_BLOCK_W["scale"]))
    out = proj(x)
    assert out.shape == (rows, 512) and out.dtype == torch.bfloat16
    want = proj.reference_input(x) @ proj.weight.float().t()
    assert ((out.float() - want).norm() / want.norm()).item() < 1e-2
