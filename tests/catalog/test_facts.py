"""Every checkpoint's computation-changing facts, pinned: the scheme of each role, the MoE router
(gate and logits dtype, scoring, selection, bias, renormalize, scale) and the expert activation.

Each row restates docs/catalog-facts.md; a change to a data file, the implementation table or
the generator that moves one of them fails here. The values were checked against each
checkpoint's config.json and vLLM 0.26.0's model code (sources in docs/catalog-facts.md).
"""

from __future__ import annotations

from typing import Any, Optional

import pytest

from operatorx.catalog import generate, load_catalog
from operatorx.catalog.gemm_roles import gemm_shapes
from operatorx.catalog.schemes import ROLES, presets
from operatorx.spec.gemm import GemmArgs
from operatorx.spec.moe import GroupedTopK, MoeArgs

#: scheme name -> (preset of most roles, {role: preset} for the others). ROLES are attn_qkv,
#: attn_out, dense_mlp, experts, shared_experts, router (the gate GEMM), lm_head and
#: linear_attn_ba (Qwen3.5's in_proj_ba; it follows attn_qkv unless a scheme names it).
Schemes = dict[str, tuple[str, dict[str, str]]]

_FP8_BLOCK_DEEPSEEK: Schemes = {"fp8_block": ("fp8_block", {"router": "bf16", "lm_head": "bf16"})}
_LLAMA: Schemes = {"bf16": ("bf16", {}), "fp8_tensor": ("fp8_tensor", {"lm_head": "bf16"}),
                   "fp8_channel": ("fp8_channel", {"lm_head": "bf16"})}
_BF16: Schemes = {"bf16": ("bf16", {})}
_DSV4: Schemes = {"fp8_ue8m0_fp4_experts": ("fp8_block_ue8m0", {"experts": "w4a16_mxfp4", "router": "bf16",
                                                                 "lm_head": "bf16"})}
_GPT_OSS: Schemes = {"mxfp4_experts": ("bf16", {"experts": "w4a16_mxfp4"})}
_MINIMAX: Schemes = {"fp8_block": ("fp8_block", {"router": "fp32", "lm_head": "bf16"})}
_KIMI_INT4: Schemes = {"w4a16_int4_experts": ("bf16", {"experts": "w4a16_int4_g32"})}


def _moe(gate: str, logits: str, scoring: str, select: str, bias: bool, renormalize: bool, scale: float,
         act: str = "silu", limit: Optional[float] = None, shared_gate: Optional[str] = None,
         expert_bias: bool = False) -> dict[str, Any]:
    return {"gate": (gate, logits), "scoring": scoring, "select": select, "bias": bias, "renormalize": renormalize,
            "scale": scale, "activation": (act, limit), "shared_gate": shared_gate, "expert_bias": expert_bias}


_DEEPSEEK_V3_ROUTER = _moe("bf16", "bf16", "sigmoid", "grouped_topk", True, True, 2.5)
_GLM4 = _moe("fp32", "fp32", "sigmoid", "grouped_topk", True, True, 2.5)
_QWEN3 = _moe("bf16", "bf16", "softmax", "topk", False, True, 1.0)
_MINIMAX_ROUTER = _moe("fp32", "fp32", "sigmoid", "topk", True, True, 1.0)
_GLM5 = _moe("bf16", "fp32", "sigmoid", "grouped_topk", True, True, 2.5)
_GLM5_NVFP4: Schemes = {"nvfp4_experts": ("nvfp4", {"shared_experts": "bf16", "router": "bf16"})}
_KIMI = _moe("bf16", "bf16", "sigmoid", "grouped_topk", True, True, 2.827)
_MINIMAX_M3 = _moe("fp32", "fp32", "sigmoid", "topk", True, True, 2.0, "swigluoai", 7.0)
_GPT_OSS_ROUTER = _moe("bf16", "bf16", "softmax", "topk", False, True, 1.0, "swigluoai", 7.0, expert_bias=True)

FACTS: dict[str, tuple[Schemes, Optional[dict[str, Any]]]] = {
    "amd/DeepSeek-R1-0528-MXFP4": ({"mxfp4": ("bf16", {"dense_mlp": "mxfp4", "experts": "mxfp4",
                                                       "shared_experts": "mxfp4"})}, _DEEPSEEK_V3_ROUTER),
    "nvidia/DeepSeek-R1-NVFP4": ({"nvfp4": ("bf16", {"dense_mlp": "nvfp4", "experts": "nvfp4",
                                                     "shared_experts": "nvfp4"})}, _DEEPSEEK_V3_ROUTER),
    "deepseek-ai/DeepSeek-R1-0528": (_FP8_BLOCK_DEEPSEEK, _DEEPSEEK_V3_ROUTER),
    "deepseek-ai/DeepSeek-V2-Lite": (_BF16, _moe("bf16", "bf16", "softmax", "grouped_topk", False, False, 1.0)),
    "deepseek-ai/DeepSeek-V3.2": (_FP8_BLOCK_DEEPSEEK, _DEEPSEEK_V3_ROUTER),
    "deepseek-ai/DeepSeek-V3": (_FP8_BLOCK_DEEPSEEK, _DEEPSEEK_V3_ROUTER),
    "deepseek-ai/DeepSeek-V4-Flash": (_DSV4, _moe("bf16", "fp32", "sqrtsoftplus", "topk", True, True, 1.5,
                                                  limit=10.0)),
    "deepseek-ai/DeepSeek-V4-Pro": (_DSV4, _moe("bf16", "fp32", "sqrtsoftplus", "topk", True, True, 2.5, limit=10.0)),
    "zai-org/GLM-4.5": ({"bf16": ("bf16", {"router": "fp32"})}, _GLM4),
    "inference-optimization/GLM-4.6-FP8-dynamic": ({"fp8_channel": ("fp8_channel", {"router": "fp32",
                                                                                    "lm_head": "bf16"})}, _GLM4),
    "RedHatAI/GLM-4.6-NVFP4": ({"nvfp4": ("nvfp4", {"router": "fp32", "lm_head": "bf16"})}, _GLM4),
    "zai-org/GLM-4.6": ({"bf16": ("bf16", {"router": "fp32"})}, _GLM4),
    "zai-org/GLM-4.7": ({"bf16": ("bf16", {"router": "fp32"})}, _GLM4),
    "zai-org/GLM-5": (_BF16, _moe("bf16", "fp32", "sigmoid", "grouped_topk", True, True, 2.5)),
    "openai/gpt-oss-120b": (_GPT_OSS, _GPT_OSS_ROUTER),
    "openai/gpt-oss-20b": (_GPT_OSS, _GPT_OSS_ROUTER),
    "moonshotai/Kimi-K2-Instruct": (_FP8_BLOCK_DEEPSEEK, _moe("bf16", "bf16", "sigmoid", "grouped_topk", True, True,
                                                                  2.827)),
    "meta-llama/Llama-3.1-405B-Instruct": (_LLAMA, None),
    "meta-llama/Llama-3.1-70B-Instruct": (_LLAMA, None),
    "meta-llama/Llama-3.1-8B-Instruct": (_LLAMA, None),
    "meta-llama/Llama-3.3-70B-Instruct": (_LLAMA, None),
    "MiniMaxAI/MiniMax-M2.5": (_MINIMAX, _MINIMAX_ROUTER),
    "MiniMaxAI/MiniMax-M2.7": (_MINIMAX, _MINIMAX_ROUTER),
    "MiniMaxAI/MiniMax-M2": (_MINIMAX, _MINIMAX_ROUTER),
    "mistralai/Mixtral-8x22B-v0.1": (_BF16, _QWEN3),
    "mistralai/Mixtral-8x7B-v0.1": (_BF16, _QWEN3),
    "Qwen/Qwen3-14B": (_BF16, None),
    "Qwen/Qwen3-235B-A22B-Thinking-2507": (_BF16, _QWEN3),
    "Qwen/Qwen3-30B-A3B-Base": (_BF16, _QWEN3),
    "Qwen/Qwen3-32B": (_BF16, None),
    "Qwen/Qwen3-8B": (_BF16, None),
    "Qwen/Qwen3-Coder-480B-A35B-Instruct": (_BF16, _QWEN3),
    "Qwen/Qwen3.5-35B-A3B": (_BF16, {**_QWEN3, "shared_gate": "sigmoid"}),
    "Qwen/Qwen3.5-397B-A17B": (_BF16, {**_QWEN3, "shared_gate": "sigmoid"}),
    # issue 14 item 5: the checkpoints upstream moe_small uses (sources: docs/catalog-facts.md)
    "Qwen/Qwen3.5-397B-A17B-FP8": ({"fp8_block_bf16scale": ("fp8_block_bf16scale", {
        "router": "bf16", "lm_head": "bf16", "linear_attn_ba": "bf16"})}, {**_QWEN3, "shared_gate": "sigmoid"}),
    "zai-org/GLM-5.1-FP8": (_FP8_BLOCK_DEEPSEEK, _moe("bf16", "fp32", "sigmoid", "grouped_topk", True, True, 2.5)),
    "zai-org/GLM-5.2-FP8": (_FP8_BLOCK_DEEPSEEK, _moe("bf16", "fp32", "sigmoid", "grouped_topk", True, True, 2.5)),
    "moonshotai/Kimi-K2.5": (_KIMI_INT4, _moe("bf16", "bf16", "sigmoid", "grouped_topk", True, True, 2.827)),
    "moonshotai/Kimi-K2.6": (_KIMI_INT4, _moe("bf16", "bf16", "sigmoid", "grouped_topk", True, True, 2.827)),
    "MiniMaxAI/MiniMax-M3-MXFP8": ({"mxfp8": ("mxfp8", {"router": "fp32", "lm_head": "bf16"})},
                                   _moe("fp32", "fp32", "sigmoid", "topk", True, True, 2.0, "swigluoai", 7.0)),
    "nvidia/MiniMax-M3-NVFP4": ({"nvfp4_experts_mxfp8": ("mxfp8", {"experts": "nvfp4", "router": "fp32",
                                                                 "lm_head": "bf16"})},
                                _moe("fp32", "fp32", "sigmoid", "topk", True, True, 2.0, "swigluoai", 7.0)),
    # MoE-only variants (their other role groups are declared not_produced; upstream moe_small is the source)
    "nvidia/Qwen3.5-397B-A17B-NVFP4": ({"nvfp4_experts": ("nvfp4", {"shared_experts": "bf16", "router": "bf16"})},
                                       {**_QWEN3, "shared_gate": "sigmoid"}),
    "amd/Qwen3.5-397B-A17B-MXFP4": ({"mxfp4_experts": ("mxfp4", {"shared_experts": "bf16", "router": "bf16"})},
                                    {**_QWEN3, "shared_gate": "sigmoid"}),
    "Qwen/Qwen3.8-Flash-Next-FP8": ({"fp8_block_bf16scale_experts": ("fp8_block_bf16scale", {
        "shared_experts": "bf16", "router": "bf16"})}, {**_QWEN3, "shared_gate": "sigmoid"}),
    "RadixArk/Qwen3.8-Flash-Next-NVFP4": ({"nvfp4_experts": ("nvfp4", {"shared_experts": "bf16", "router": "bf16"})},
                                          {**_QWEN3, "shared_gate": "sigmoid"}),
    "nvidia/GLM-5.1-NVFP4": (_GLM5_NVFP4, _GLM5),
    "nvidia/GLM-5.2-NVFP4": (_GLM5_NVFP4, _GLM5),
    "amd/GLM-5.1-MXFP4": ({"mxfp4_experts": ("mxfp4", {"router": "bf16"})}, _GLM5),
    "amd/GLM-5.2-MXFP4": ({"mxfp4_experts": ("mxfp4", {"router": "bf16"})}, _GLM5),
    "zai-org/GLM-5.3": ({"fp8_block": ("fp8_block", {"router": "bf16"})}, _GLM5),
    "nvidia/Kimi-K2.5-NVFP4": ({"nvfp4_experts": ("nvfp4", {"router": "bf16"})}, _KIMI),
    "nvidia/Kimi-K2.6-NVFP4": ({"nvfp4_experts": ("nvfp4", {"router": "bf16"})}, _KIMI),
    "amd/Kimi-K2.5-MXFP4": ({"mxfp4_experts": ("mxfp4", {"router": "bf16"})}, _KIMI),
    "amd/MiniMax-M3-MXFP4": ({"mxfp4_experts": ("mxfp4", {"router": "fp32"})}, _MINIMAX_M3),
    "nvidia/MiniMax-M2.5-NVFP4": ({"nvfp4_experts": ("nvfp4", {"router": "fp32"})}, _MINIMAX_ROUTER),
    "amd/MiniMax-M2.5-MXFP4": ({"mxfp4_experts": ("mxfp4", {"router": "fp32"})}, _MINIMAX_ROUTER),
    "moonshotai/Kimi-K3": ({"mxfp4_experts": ("bf16", {"experts": "w4a16_mxfp4"})},
                           _moe("bf16", "fp32", "sigmoid", "grouped_topk", True, True, 1.0, "situ")),
    "deepseek-ai/DeepSeek-V4.1-Flash": ({"fp8_block32_ue8m0_fp4_experts": ("fp8_block32_ue8m0", {
        "experts": "w4a16_mxfp4", "router": "bf16", "lm_head": "bf16"})},
        _moe("bf16", "fp32", "sqrtsoftplus", "topk", True, True, 1.5, limit=10.0)),
}

#: Generic schemes cite a labelled source so they are never read as a published quantization.
GENERIC = {"fp8_tensor", "fp8_channel"}


def test_every_checkpoint_has_a_row():
    assert sorted(c.id for c in load_catalog()) == sorted(FACTS)


def _expected_roles(schemes: Schemes) -> dict[str, dict[str, str]]:
    return {name: {r: over.get(r, default) for r in ROLES} for name, (default, over) in schemes.items()}


@pytest.mark.parametrize("ckpt_id", sorted(FACTS))
def test_scheme_per_role_in_the_data_and_the_generated_cases(ckpt_id):
    ckpt = next(c for c in load_catalog() if c.id == ckpt_id)
    expected = _expected_roles(FACTS[ckpt_id][0])
    assert {name: {r: rs[r].name for r in ROLES} for name, rs in ckpt.schemes.items()} == expected
    tp = min(ckpt.tps)
    by_role = {s.role: s for s in gemm_shapes(ckpt.arch, tp, True, [], ckpt.not_produced)}
    for name, roles in expected.items():
        source = ckpt.source_id(name)
        assert (source != ckpt.id) == (name in GENERIC and ckpt.family == "llama-3"), source
        if source != ckpt.id:
            assert source == f"{ckpt.id}:generic-{name}"
        cases = generate([ckpt_id], [tp], [1], moe_tokens=[1], schemes=[name])
        seen = 0
        for case in cases:
            for src in (s for s in case.sources if s.startswith(source + "/")):
                role = src[len(source) + 1:]
                if isinstance(case.args, GemmArgs):
                    shape = by_role[role]
                    want = presets()[shape.preset or roles[shape.scheme_role]]
                    assert (case.args.a.model_dump(exclude_none=True), case.args.b.model_dump(exclude_none=True)) == \
                        (want.a, want.b), f"{src}: not {want.name}"
                else:
                    assert isinstance(case.args, MoeArgs)
                    e, want = case.args.experts, presets()[roles["experts"]]
                    assert (e.a1.model_dump(exclude_none=True), e.w1.model_dump(exclude_none=True)) == (want.a, want.b)
                    if case.args.shared is not None:
                        s, want = case.args.shared, presets()[roles["shared_experts"]]
                        assert (s.a1.model_dump(exclude_none=True), s.w1.model_dump(exclude_none=True)) == \
                            (want.a, want.b)
                seen += 1
        assert seen >= len(by_role)


@pytest.mark.parametrize("ckpt_id", sorted(k for k, v in FACTS.items() if v[1] is not None))
def test_router_and_activation(ckpt_id):
    ckpt = next(c for c in load_catalog() if c.id == ckpt_id)
    want = FACTS[ckpt_id][1]
    assert want is not None
    moe = [c for c in generate([ckpt_id], [min(ckpt.tps)], [1], moe_tokens=[1]) if c.type == "moe"]
    routed = [c.args for c in moe if not any(s.split("/")[-1].endswith(":hash") for s in c.sources)]
    assert len(routed) == len(ckpt.schemes)
    for a in routed:
        assert isinstance(a, MoeArgs)
        r, act = a.router, a.activation
        got = {"gate": (r.gate.dtype, r.gate.logits), "scoring": r.scoring, "select": r.select.kind, "bias": r.bias,
               "renormalize": r.renormalize, "scale": r.scale, "activation": (act.kind, act.limit),
               "shared_gate": a.shared.gate if a.shared else None, "expert_bias": a.experts.bias}
        assert got == want
        if isinstance(r.select, GroupedTopK):  # vLLM's grouped router; one group where config n_group is 1
            assert (r.select.groups, r.select.topk_groups) == (ckpt.arch.opt("n_group"), ckpt.arch.opt("topk_group"))
        # written out, never left to a reader's default
        assert r.weight_on_input is False and act.gated is True and act.interleaved is not None


def test_gpt_oss_activation_constants():
    a = next(c.args for c in generate(["openai/gpt-oss-120b"], [1], [1], moe_tokens=[1]) if c.type == "moe")
    assert isinstance(a, MoeArgs)
    act = a.activation
    assert (act.kind, act.interleaved, act.alpha, act.beta, act.limit) == ("swigluoai", True, 1.702, 1.0, 7.0)


def test_kimi_k2_is_block_fp8_everywhere_but_router_and_lm_head():
    """Issue 17: the released Kimi-K2 is block FP8 (no bf16 release); the MoE renormalizes."""
    cases = generate(["moonshotai/Kimi-K2-Instruct"], [8], [1], moe_tokens=[1])
    for case in cases:
        role = case.sources[0].rsplit("/", 1)[-1]
        if isinstance(case.args, GemmArgs):
            want = "bf16" if role in ("mlp.gate", "lm_head") else "e4m3"
            assert case.args.b.dtype == want, role
            if want == "e4m3":
                assert case.args.b.scale is not None and case.args.b.scale.group == [128, 128]
                assert case.args.a.scale is not None and case.args.a.scale.group == [1, 128]
                assert case.args.a.scale.static is False
        else:
            assert isinstance(case.args, MoeArgs)
            assert case.args.router.renormalize is True and case.args.experts.w1.dtype == "e4m3"
