"""MoE layer cases: router, experts and shared experts per rank."""

from __future__ import annotations

from operatorx.catalog import generate


def test_deepseek_v3_moe_layer_tp8():
    [case] = [c for c in generate(["deepseek-ai/DeepSeek-V3"], [8], [1], moe_tokens=[1]) if c.type == "moe"]
    a = case.args
    assert (a.tokens, a.hidden) == (1, 7168)
    assert (a.experts.num, a.experts.top_k, a.experts.inter) == (256, 8, 2048 // 8)
    assert a.router.scoring == "sigmoid" and a.router.bias is True and a.router.renormalize is True
    assert (a.router.select.groups, a.router.select.topk_groups) == (8, 4)
    assert a.router.scale == 2.5
    assert a.shared.inter == 2048 // 8
    assert a.experts.w1.scale.group == [128, 128]
    assert case.sources == ["deepseek-ai/DeepSeek-V3/mlp.experts"]


def test_gpt_oss_experts_w4a16_swigluoai():
    [case] = [c for c in generate(["openai/gpt-oss-120b"], [1], [1], moe_tokens=[8]) if c.type == "moe"]
    a = case.args
    assert (a.experts.num, a.experts.top_k, a.experts.inter) == (128, 4, 2880)
    assert a.experts.a1.dtype == "bf16" and a.experts.w1.dtype == "e2m1"
    assert a.activation.kind == "swigluoai" and a.activation.limit == 7.0
    assert a.router.scoring == "softmax" and a.shared is None


def test_qwen35_shared_expert_gate_and_linear_attention():
    cases = generate(["Qwen/Qwen3.5-397B-A17B"], [8], [1], moe_tokens=[1])
    roles = {s.rsplit("/", 1)[-1] for c in cases for s in c.sources}
    assert {"linear_attn.in_proj_qkvz", "linear_attn.out_proj", "mlp.shared_expert_gate"} <= roles
    moe = next(c for c in cases if c.type == "moe").args
    assert moe.shared.gate == "sigmoid" and moe.shared.inter == 1024 // 8
