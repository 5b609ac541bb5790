"""vLLM MoE coverage on CPU without vLLM: plans and refusals for each case kind (fp32 gates, bf16
block scales, swigluoai / clamped SiLU, hash / sqrtsoftplus / latent / situ), and the fp32
reference's activations and routed scale against hand-derived values."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from operatorx.backends.vllm import quant_map as qm
from operatorx.backends.vllm.moe_reference import gated_activation, moe_reference
from operatorx.backends.vllm.weights import quantize_matrix
from operatorx.spec import Case, load_testlist, resolve_testlist
from operatorx.spec.moe import Activation, MoeArgs
from tests.backends.vllm.cases import SCHEMES, moe_case


def _args(case: Case) -> MoeArgs:
    assert isinstance(case.args, MoeArgs)
    return case.args


def _plan(scheme: str, **kw: Any) -> Any:
    return qm.moe_plan(_args(moe_case(scheme, **kw)))


def _with(case: Case, **router_or_experts: Any) -> MoeArgs:
    """The case's args with router / experts fields replaced (validated again)."""
    d = case.model_dump(exclude_none=True)
    for key, value in router_or_experts.items():
        where, field = key.split("__")
        d["args"][where][field] = value
    return _args(Case.model_validate(d))


# --- 1. fp32 router gate -------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", ["bf16", "fp8_block"])
def test_fp32_grouped_gate_is_glm4_moe_wiring(scheme: str) -> None:
    args = _args(moe_case(scheme, style="glm"))
    plan = qm.moe_plan(args)
    assert isinstance(plan, qm.Plan) and plan.scheme == scheme
    gw = qm.gate_wiring(args)
    assert isinstance(gw, qm.GateWiring)
    assert (gw.style, gw.gate_cls, gw.params_fp32, gw.logits_fp32) == ("glm4_moe", "torch.nn.Linear", True, True)
    assert gw.external and gw.routed_scale_on_output


def test_fp32_topk_gate_is_minimax_m2_wiring() -> None:
    args = _args(moe_case("fp8_block", style="minimax"))
    plan = qm.moe_plan(args)
    assert isinstance(plan, qm.Plan) and plan.scheme == "fp8_block"
    gw = qm.gate_wiring(args)
    assert isinstance(gw, qm.GateWiring)
    assert (gw.style, gw.gate_cls, gw.params_fp32, gw.external, gw.routed_scale_on_output) == \
        ("minimax_m2", "GateLinear", True, True, False)


def test_bf16_gates_keep_their_runner_held_wiring() -> None:
    deepseek = qm.gate_wiring(_args(moe_case("bf16", style="deepseek")))
    qwen = qm.gate_wiring(_args(moe_case("bf16", style="qwen")))
    assert isinstance(deepseek, qm.GateWiring) and isinstance(qwen, qm.GateWiring)
    assert (deepseek.style, deepseek.external, deepseek.routed_scale_on_output) == ("deepseek_v2", False, True)
    assert (qwen.style, qwen.gate_cls, qwen.external) == ("qwen2_moe", "ReplicatedLinear", False)


def test_softmax_bf16_gate_with_fp32_logits_is_refused_by_name() -> None:
    args = _with(moe_case("bf16", style="qwen"), router__gate={"dtype": "bf16", "logits": "fp32"})
    why = qm.moe_plan(args)
    assert isinstance(why, str) and "ReplicatedLinear gate that returns bf16 logits" in why


def test_fp32_gate_with_bf16_logits_is_refused_by_name() -> None:
    args = _with(moe_case("bf16", style="glm"), router__gate={"dtype": "fp32", "logits": "bf16"})
    why = qm.moe_plan(args)
    assert isinstance(why, str) and "fp32 router gate with bf16 logits" in why


def test_shipped_fp32_gate_checkpoints_now_plan_and_v4_names_its_scheme() -> None:
    by_source: dict[str, Any] = {}
    for case in load_testlist(resolve_testlist("moe_small")):
        for src in case.sources or []:
            by_source.setdefault(src, qm.moe_plan(_args(case)))
    fp32_gate = [s for s in by_source if s.startswith(("zai-org/GLM-4.", "MiniMaxAI/MiniMax-M2"))]
    assert fp32_gate, "the shipped moe_small has GLM-4.5/MiniMax-M2 cases"
    for src in fp32_gate:
        assert isinstance(by_source[src], qm.Plan), (src, by_source[src])
    minimax = by_source["MiniMaxAI/MiniMax-M2.5/mlp.experts"]
    assert isinstance(minimax, qm.Plan) and minimax.scheme == "fp8_block"
    v4 = {s: v for s, v in by_source.items() if s.startswith("deepseek-ai/DeepSeek-V4")
          and not s.startswith("deepseek-ai/DeepSeek-V4.1")}
    assert v4 and all(isinstance(v, qm.Plan) and v.scheme == "mxfp4_w4a16" and v.shared_scheme == "fp8_block"
                      and v.quant is not None and v.quant.cls == "DeepseekV4FP8Config" for v in v4.values()), v4
    # DeepSeek-V4.1's 32x32 FP8 blocks: the shared expert's own scheme is the reason
    v41 = [v for s, v in by_source.items() if s.startswith("deepseek-ai/DeepSeek-V4.1")]
    assert v41 and all(isinstance(v, str) and v.startswith("shared experts: 32x32 block") for v in v41), v41
    # checkpoints the catalog may carry: bf16 block scales plan; MXFP8 + swigluoai names MXFP8
    for src, plan in by_source.items():
        if "Qwen3.5-397B-A17B-FP8/" in src:
            assert isinstance(plan, qm.Plan) and plan.weight_scale_dtype == "bf16", (src, plan)
        if "Qwen3.8-Flash-Next-FP8/" in src:        # bf16 shared MLP beside block-FP8 routed experts
            assert isinstance(plan, qm.Plan) and plan.shared_scheme == "bf16" and plan.scheme == "fp8_block", plan
        if "MiniMax-M3-MXFP8/" in src:
            assert isinstance(plan, str) and plan.startswith("experts: MXFP8") and "swiglu" not in plan, plan


# --- 2. bf16 block weight scales ------------------------------------------------------------------------

def test_bf16_block_weight_scales_plan_with_bf16_checkpoint_scales() -> None:
    for style in ("deepseek", "qwen"):
        plan = _plan("fp8_block_bf16scale", style=style)
        assert isinstance(plan, qm.Plan) and plan.scheme == "fp8_block" and plan.weight_scale_dtype == "bf16"
        assert any("bf16" in n for n in plan.notes)
    assert isinstance(plan, qm.Plan) and plan.quant is not None and plan.quant.cls == "Fp8Config"
    fp32 = _plan("fp8_block")
    assert isinstance(fp32, qm.Plan) and fp32.weight_scale_dtype == "fp32"


def test_bf16_activation_scales_are_refused_naming_the_activation_scales() -> None:
    case = moe_case("fp8_block")
    d = case.model_dump(exclude_none=True)
    for k in ("a1", "a2"):
        d["args"]["experts"][k]["scale"]["dtype"] = "bf16"
    d["args"]["shared"]["a1"]["scale"]["dtype"] = "bf16"
    why = qm.moe_plan(_args(Case.model_validate(d)))
    assert isinstance(why, str) and "1x128 activation scales" in why and "bf16" in why


def test_bf16_block_scales_are_exact_and_dequantize_like_fp32() -> None:
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(256, 384, generator=gen) / 20
    a, b = quantize_matrix(w, "fp8_block", scale_dtype="fp32"), quantize_matrix(w, "fp8_block", scale_dtype="bf16")
    assert a.scale is not None and b.scale is not None
    assert b.scale.dtype == torch.bfloat16 and tuple(b.scale.shape) == (2, 3)
    assert torch.equal(b.scale.float(), a.scale.float()) and torch.equal(a.dequant(), b.dequant())
    assert float((b.dequant() - w).norm() / w.norm()) < 0.05
    with pytest.raises(ValueError, match="fp32, bf16 or ue8m0"):
        quantize_matrix(w, "fp8_block", scale_dtype="fp16")


# --- 2b. MXFP4 routed experts (DeepSeek-V4) ---------------------------------------------------------------

_V4_ACT = {"kind": "silu", "gated": True, "limit": 10.0}


@pytest.mark.parametrize("style", ["dsv4", "dsv4_hash"])
def test_deepseek_v4_mxfp4_experts_plan_under_its_own_config(style: str) -> None:
    plan = _plan("mxfp4_w4a16", style=style, activation=_V4_ACT, shared_as="fp8_block_ue8m0")
    assert isinstance(plan, qm.Plan), plan
    assert (plan.scheme, plan.shared_scheme, plan.weight_scale_dtype) == ("mxfp4_w4a16", "fp8_block", "ue8m0")
    assert plan.quant is not None and plan.quant.cls == "DeepseekV4FP8Config"
    assert plan.quant.config["weight_block_size"] == [128, 128]
    assert "MARLIN" in plan.expected_sm90


@pytest.mark.parametrize("kw,words", [
    ({"style": "qwen"}, "outside a DeepSeek-V4 or gpt-oss block"),             # Qwen-style block: not wired
    ({"style": "dsv4", "shared_bf16": True}, "shared experts in bf16 beside DeepSeek-V4-style MXFP4"),
    ({"style": "dsv4", "shared_as": "fp8_block"}, "store their FP8 scales as ue8m0"),
    ({"style": "dsv4", "shared_as": "mxfp8"}, "shared experts: MXFP8"),
    ({"style": "dsv4", "shared": False, "hidden": 384}, "pads hidden to a multiple of 256"),
])
def test_mxfp4_experts_refusals_name_the_piece(kw: dict[str, Any], words: str) -> None:
    why = _plan("mxfp4_w4a16", activation=_V4_ACT, **kw)
    assert isinstance(why, str) and words in why, why


def test_gpt_oss_mxfp4_experts_plan_with_biases_under_its_config() -> None:
    plan = _plan("mxfp4_w4a16", style="gpt_oss", shared=False, activation=OAI, expert_bias=True)
    assert isinstance(plan, qm.Plan), plan
    assert plan.quant is not None and plan.quant.cls == "GptOssMxfp4Config" and plan.shared_scheme is None
    assert "Monolithic" in plan.expected_sm90
    # the same biases on block-FP8 experts are still refused, naming where they are wired
    why = _plan("fp8_block", style="gpt_oss", shared=False, activation=OAI, expert_bias=True)
    assert isinstance(why, str) and "GptOssMxfp4MoEMethod" in why, why


@pytest.mark.parametrize("kw,words", [
    ({"routing": {"distribution": "balanced", "seed": 0}}, "routes inside its kernel"),
    ({"style": "deepseek"}, "ignores expert groups and a routed scale"),     # grouped top-k, scale 2.5
    ({"style": "qwen"}, "no vLLM model has an interleaved shared expert"),
])
def test_gpt_oss_mxfp4_refusals(kw: dict[str, Any], words: str) -> None:
    kw = {"style": "gpt_oss", "shared": False, **kw}
    if kw["style"] == "deepseek":       # its router (grouped, scaled) on a gpt-oss layer, no shared expert
        case = moe_case("mxfp4_w4a16", activation=OAI, expert_bias=True, **kw)
        why = qm.moe_plan(_args(case))
        assert isinstance(why, str) and words in why, why
        return
    if kw["style"] == "qwen":
        kw["shared"] = True
    why = _plan("mxfp4_w4a16", activation=OAI, expert_bias=True, **kw)
    assert isinstance(why, str) and words in why, why


def test_reference_adds_expert_biases_inside_each_expert() -> None:
    """gpt-oss: h = x w1ᵀ + b1 (to bf16), y = act(h) w2ᵀ + b2, weighted by the router."""
    gen = torch.Generator().manual_seed(4)
    h, inter = 64, 64
    x = torch.randn(2, h, generator=gen).to(torch.bfloat16)
    q1 = quantize_matrix(torch.randn(2 * inter, h, generator=gen) / 8, "mxfp4_w4a16")
    q2 = quantize_matrix(torch.randn(h, inter, generator=gen) / 8, "mxfp4_w4a16")
    b1, b2 = torch.randn(1, 2 * inter, generator=gen), torch.randn(1, h, generator=gen)
    act = Activation.model_validate(OAI)
    ids, weights = torch.tensor([[0], [0]]), torch.tensor([[1.0], [0.25]])
    ref = {"experts": [(q1, q2)], "shared": None, "expert_bias": (b1, b2)}
    out = moe_reference(x, ids, weights, ref, "mxfp4_w4a16", act)["none"]
    hh = (x.float() @ q1.dequant().T + b1).to(torch.bfloat16).float()
    want = gated_activation(hh, act).to(torch.bfloat16).float() @ q2.dequant().T + b2
    assert torch.allclose(out, want * weights, rtol=1e-5, atol=1e-5)
    plain = moe_reference(x, ids, weights, {**ref, "expert_bias": None}, "mxfp4_w4a16", act)["none"]
    assert float((plain - out).abs().max()) > 0.1          # the biases change the result


def test_int4_experts_plan_as_kimi_k25_ships_them() -> None:
    plan = _plan("int4_w4a16", style="deepseek", shared_bf16=True)
    assert isinstance(plan, qm.Plan) and (plan.scheme, plan.shared_scheme) == ("int4_w4a16", "bf16"), plan
    assert plan.quant is not None and plan.quant.cls == "CompressedTensorsConfig"
    weights = plan.quant.config["config_groups"]["group_0"]["weights"]
    assert (weights["type"], weights["num_bits"], weights["group_size"]) == ("int", 4, 32)
    why = _plan("int4_w4a16", style="deepseek")              # an INT4 shared MLP: not wired
    assert isinstance(why, str) and "INT4 shared expert" in why, why
    small = _plan("int4_w4a16", style="deepseek", shared_bf16=True, hidden=320)
    assert isinstance(small, str) and "needs hidden x128" in small, small
    # Marlin pads the intermediate size itself (inside its weight prep): the group's x32 is enough
    assert isinstance(_plan("int4_w4a16", style="deepseek", shared_bf16=True, inter=96), qm.Plan)


def test_int4_marlin_tensors_transpose_each_matrix() -> None:
    from operatorx.backends.vllm.moe_build import int4_marlin_tensors

    gen = torch.Generator().manual_seed(6)
    h, inter = 64, 32
    per = [(quantize_matrix(torch.randn(2 * inter, h, generator=gen), "int4_w4a16"),
            quantize_matrix(torch.randn(h, inter, generator=gen), "int4_w4a16")) for _ in range(3)]
    t = int4_marlin_tensors(per, h, inter)
    assert tuple(t["w13_weight_packed"].shape) == (3, h // 8, 2 * inter)
    assert tuple(t["w2_weight_packed"].shape) == (3, inter // 8, h)
    assert tuple(t["w13_weight_scale"].shape) == (3, h // 32, 2 * inter)
    assert t["w13_weight_scale"].dtype == torch.bfloat16
    assert torch.equal(t["w2_weight_packed"][1], per[1][1].q.T)
    assert t["w13_weight_shape"][0].tolist() == [2 * inter, h] and t["w2_weight_shape"][2].tolist() == [h, inter]
    assert t["w13_weight_g_idx"][0].tolist() == [k // 32 for k in range(h)]
    assert t["w2_g_idx_sort_indices"][0].tolist() == list(range(inter))


def test_mxfp4_weights_with_fp4_activations_still_name_the_missing_mma() -> None:
    a, w = SCHEMES["mxfp4_w4a16"]
    fp4_act = {"dtype": "e2m1", "scale": {"dtype": "ue8m0", "static": False, "group": [1, 32]}}
    case = moe_case("mxfp4_w4a16", style="dsv4", activation=_V4_ACT, shared_as="fp8_block_ue8m0")
    d = case.model_dump(exclude_none=True)
    d["args"]["experts"]["a1"] = d["args"]["experts"]["a2"] = fp4_act
    why = qm.moe_plan(_args(Case.model_validate(d)))
    assert isinstance(why, str) and "no fp4 MMA" in why, why


def test_mxfp4_matrix_is_packed4_and_ue8m0_block_scales_are_exact() -> None:
    from operatorx.backends.packed4 import MxFp4, dequantize_mxfp4

    gen = torch.Generator().manual_seed(5)
    w = torch.randn(64, 96, generator=gen) / 8
    m = quantize_matrix(w, "mxfp4_w4a16")
    assert m.q.dtype == torch.uint8 and tuple(m.q.shape) == (64, 48) and m.scale is not None
    assert m.scale.dtype == torch.uint8 and tuple(m.scale.shape) == (64, 3)
    assert torch.equal(m.dequant(), dequantize_mxfp4(MxFp4(m.q, m.scale)))
    assert torch.equal(m.dequant(rows=slice(8, 16)), m.dequant()[8:16])
    assert 0.05 < float((m.dequant() - w).norm() / w.norm()) < 0.2      # 4-bit: coarse but near
    w8 = torch.randn(256, 384, generator=gen) / 8
    e = quantize_matrix(w8, "fp8_block", scale_dtype="ue8m0")
    f = quantize_matrix(w8, "fp8_block", scale_dtype="fp32")
    assert e.scale is not None and f.scale is not None and e.scale.dtype == torch.float8_e8m0fnu
    assert torch.equal(e.scale.float(), f.scale.float()) and torch.equal(e.dequant(), f.dequant())


def test_pad_to_params_places_each_w13_half_and_w2_as_the_loader_does() -> None:
    from operatorx.backends.vllm.moe_build import pad_to_params

    e, inter, inter_p, h, h_p = 2, 3, 4, 5, 6
    w13 = torch.arange(e * 2 * inter * h, dtype=torch.float32).reshape(e, 2 * inter, h) + 1
    w2 = torch.arange(e * h * inter, dtype=torch.float32).reshape(e, h, inter) + 1
    params = {"w13_weight": torch.nn.Parameter(torch.empty(e, 2 * inter_p, h_p), requires_grad=False),
              "w2_weight": torch.nn.Parameter(torch.empty(e, h_p, inter_p), requires_grad=False)}
    out = pad_to_params({"w13_weight": w13, "w2_weight": w2}, params)
    assert tuple(out["w13_weight"].shape) == (e, 8, 6) and tuple(out["w2_weight"].shape) == (e, 6, 4)
    assert torch.equal(out["w13_weight"][:, :inter, :h], w13[:, :inter])                  # gate rows
    assert torch.equal(out["w13_weight"][:, inter_p:inter_p + inter, :h], w13[:, inter:])  # up rows
    assert float(out["w13_weight"].sum()) == float(w13.sum())                             # the rest is zero
    assert torch.equal(out["w2_weight"][:, :h, :inter], w2) and float(out["w2_weight"].sum()) == float(w2.sum())
    same = pad_to_params({"w2_weight": torch.ones(e, h_p, inter_p)}, params)
    assert same["w2_weight"] is not None and tuple(same["w2_weight"].shape) == (e, h_p, inter_p)


def test_pad_to_params_keeps_an_interleaved_w13_in_its_leading_rows() -> None:
    """gpt-oss's loader copies the interleaved w13 (and its bias) into param[:, :rows]: splitting it
    in halves would move neurons past the first half away from their w2 columns."""
    from operatorx.backends.vllm.moe_build import pad_to_params

    w13 = torch.arange(2 * 6 * 4, dtype=torch.float32).reshape(2, 6, 4) + 1
    b13 = torch.arange(2 * 6, dtype=torch.float32).reshape(2, 6) + 1
    params = {"w13_weight": torch.nn.Parameter(torch.empty(2, 8, 4), requires_grad=False),
              "w13_bias": torch.nn.Parameter(torch.empty(2, 8), requires_grad=False)}
    out = pad_to_params({"w13_weight": w13, "w13_bias": b13}, params, interleaved_w13=True)
    assert torch.equal(out["w13_weight"][:, :6], w13) and float(out["w13_weight"][:, 6:].abs().sum()) == 0.0
    assert torch.equal(out["w13_bias"][:, :6], b13) and float(out["w13_bias"][:, 6:].abs().sum()) == 0.0
    halves = pad_to_params({"w13_bias": b13}, params)          # gate/up halves: each at the top of its half
    assert torch.equal(halves["w13_bias"][:, :3], b13[:, :3]) and torch.equal(halves["w13_bias"][:, 4:7], b13[:, 3:])


def test_untied_check_rows_searches_every_token_and_counts_the_tied_ones() -> None:
    from operatorx.backends.vllm.moe import untied_check_rows

    untied = torch.tensor([False, True, True, False, True])
    picked, skipped = untied_check_rows(untied, 2)
    assert picked.tolist() == [1, 2] and skipped == 1
    picked, skipped = untied_check_rows(untied, 64)
    assert picked.tolist() == [1, 2, 4] and skipped == 2
    none, _ = untied_check_rows(torch.tensor([False, False]), 64)
    assert none.numel() == 0            # the check then says nothing was compared (Check.not_checked)


def test_reference_of_mxfp4_experts_beside_a_block_fp8_shared_mlp() -> None:
    """Routed part weight-only (bf16 activations, the same in every flavor); the shared MLP's fp8
    activation flavors are the ones tried."""
    from operatorx.backends.vllm.moe_reference import reference_flavors
    from operatorx.backends.vllm.reference import act_quant_dequant

    assert reference_flavors("mxfp4_w4a16", "fp8_block") == ("ue8m0", "fp32")
    assert reference_flavors("mxfp4_w4a16", None) == ("none",)
    assert reference_flavors("fp8_block", "bf16") == ("ue8m0", "fp32")
    gen = torch.Generator().manual_seed(2)
    h, inter, rows = 128, 128, 3
    x = torch.randn(rows, h, generator=gen).to(torch.bfloat16)
    experts = [(quantize_matrix(torch.randn(2 * inter, h, generator=gen) / 11, "mxfp4_w4a16"),
                quantize_matrix(torch.randn(h, inter, generator=gen) / 11, "mxfp4_w4a16")) for _ in range(2)]
    s1 = quantize_matrix(torch.randn(2 * inter, h, generator=gen) / 11, "fp8_block", scale_dtype="ue8m0")
    s2 = quantize_matrix(torch.randn(h, inter, generator=gen) / 11, "fp8_block", scale_dtype="ue8m0")
    ids = torch.tensor([[0, 1], [1, 0], [0, 1]])
    weights = torch.tensor([[0.75, 0.25], [0.5, 0.5], [1.0, 0.0]])
    act = Activation.model_validate(_V4_ACT)
    ref = {"experts": experts, "shared": (s1, s2, None), "shared_scheme": "fp8_block"}
    out = moe_reference(x, ids, weights, ref, "mxfp4_w4a16", act)
    assert set(out) == {"ue8m0", "fp32"}

    def mlp(xq: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, scheme: str, flavor: str) -> torch.Tensor:
        hh = (xq @ w1.T).to(torch.bfloat16).float()
        a = gated_activation(hh, act).to(torch.bfloat16)
        return act_quant_dequant(a, scheme, flavor) @ w2.T

    for flavor in ("ue8m0", "fp32"):
        want = torch.zeros(rows, h)
        for r in range(rows):
            for slot in range(2):
                q1, q2 = experts[int(ids[r, slot])]
                want[r] += weights[r, slot] * mlp(x[r:r + 1].float(), q1.dequant(), q2.dequant(), "bf16", "none")[0]
        want += mlp(act_quant_dequant(x, "fp8_block", flavor), s1.dequant(), s2.dequant(), "fp8_block", flavor)
        assert torch.allclose(out[flavor], want, rtol=1e-5, atol=1e-5), flavor
    assert not torch.equal(out["ue8m0"], out["fp32"])       # the flavors differ only in the shared part


# --- 3. activations -------------------------------------------------------------------------------------

OAI = {"kind": "swigluoai", "gated": True, "interleaved": True, "limit": 7.0, "alpha": 1.702, "beta": 1.0}


@pytest.mark.parametrize("scheme", ["bf16", "fp8_block"])
def test_swigluoai_and_clamped_silu_plan_for_schemes_vllm_runs(scheme: str) -> None:
    oai = _plan(scheme, style="qwen", shared=False, activation=OAI)
    assert isinstance(oai, qm.Plan) and oai.scheme == scheme
    uninter = _plan(scheme, style="qwen", activation={**OAI, "interleaved": False})
    assert isinstance(uninter, qm.Plan)
    clamped = _plan(scheme, style="deepseek", activation={"kind": "silu", "gated": True, "limit": 10.0})
    assert isinstance(clamped, qm.Plan)
    assert any("silu_and_mul_per_block_quant" in n for n in clamped.notes) is (scheme == "fp8_block")


def test_moe_activation_maps_to_fused_moe_kwargs() -> None:
    interleaved = qm.moe_activation(Activation.model_validate(OAI))
    assert isinstance(interleaved, qm.MoeAct)
    assert interleaved.fused_moe_kwargs() == {"activation": "swigluoai"}      # the kernel's own constants
    halves = qm.moe_activation(Activation.model_validate({"kind": "swigluoai", "limit": 5.0}))
    assert isinstance(halves, qm.MoeAct) and halves.shared == "SiluAndMulWithClamp"
    assert halves.fused_moe_kwargs() == {"activation": "swigluoai_uninterleave", "swiglu_limit": 5.0,
                                         "swiglu_alpha": 1.702, "swiglu_beta": 1.0}
    clamped = qm.moe_activation(Activation.model_validate({"kind": "silu", "limit": 10.0}))
    assert isinstance(clamped, qm.MoeAct)
    assert clamped.fused_moe_kwargs() == {"activation": "silu", "swiglu_limit": 10.0}
    gelu_tanh = qm.moe_activation(Activation.model_validate({"kind": "gelu_tanh"}))
    assert isinstance(gelu_tanh, qm.MoeAct) and gelu_tanh.shared == "GeluAndMul(tanh)"


@pytest.mark.parametrize("act,words", [
    ({**OAI, "alpha": 1.5}, "runs only alpha 1.702"),
    ({"kind": "gelu", "limit": 3.0}, "clamps only SiLU"),
    ({"kind": "silu", "interleaved": True}, "interleaved rows only for swigluoai"),
    ({"kind": "silu", "gated": False}, "silu_no_mul"),
    ({"kind": "situ"}, "does not define situ"),
    ({"kind": "swiglustep"}, "swiglustep_and_mul"),
])
def test_activation_refusals_name_the_missing_piece(act: dict[str, Any], words: str) -> None:
    why = qm.moe_activation(Activation.model_validate(act))
    assert isinstance(why, str) and words in why, why


def test_interleaved_swigluoai_with_a_shared_expert_is_refused() -> None:
    why = _plan("bf16", style="deepseek", activation=OAI)
    assert isinstance(why, str) and "interleaved shared expert" in why


@pytest.mark.parametrize("scheme,words", [("mxfp8", "MXFP8"), ("nvfp4", "NVFP4 with fp4 activations")])
def test_no_sm90_kernel_reason_names_the_scheme_not_the_activation(scheme: str, words: str) -> None:
    for act in (OAI, {"kind": "silu", "gated": True, "limit": 10.0}):
        why = _plan(scheme, style="qwen", shared=False, activation=act)
        assert isinstance(why, str) and words in why and "swiglu" not in why and "limit" not in why, why


# --- 4/5. shared gate, hash routing, sqrtsoftplus, latent / zero experts -------------------------------------

def test_qwen_shared_expert_gate_plans() -> None:
    args = _args(moe_case("fp8_block", style="qwen"))
    assert args.shared is not None and args.shared.gate == "sigmoid"
    assert isinstance(qm.moe_plan(args), qm.Plan)


@pytest.mark.parametrize("style", ["dsv4", "dsv4_hash"])
@pytest.mark.parametrize("scheme", ["bf16", "fp8_block"])
def test_deepseek_v4_routing_plans_with_its_gate(style: str, scheme: str) -> None:
    args = _args(moe_case(scheme, style=style, activation={"kind": "silu", "gated": True, "limit": 10.0}))
    assert isinstance(qm.moe_plan(args), qm.Plan)
    gw = qm.gate_wiring(args)
    assert isinstance(gw, qm.GateWiring)
    assert (gw.style, gw.gate_cls, gw.logits_fp32, gw.external, gw.routed_scale_on_output) == \
        ("deepseek_v4", "GateLinear", True, False, False)


@pytest.mark.parametrize("change,words", [
    ({"router__select": {"kind": "hash", "vocab": 1000}}, "topk_hash_softplus_sqrt"),      # softmax + hash
    ({"router__scoring": "sqrtsoftplus"}, "FusedTopKRouter"),                             # no bias, no hash
    ({"router__scoring": "sqrtsoftplus", "router__bias": True,
      "router__select": {"kind": "grouped_topk", "groups": 4, "topk_groups": 2}}, "GroupedTopKRouter"),
    ({"router__scoring": "sqrtsoftplus", "router__bias": True}, "bf16 GateLinear with fp32 logits"),
    ({"router__scoring": "sqrtsoftplus", "router__bias": True, "router__select": {"kind": "hash", "vocab": 10}},
     "hash routing with a score-correction bias"),
    ({"experts__latent": 128}, "routed_input_transform"),
    ({"experts__zero": 2}, "zero_expert_type"),
    ({"experts__bias": True}, "has_bias"),
])
def test_layer_features_name_what_vllm_has_and_what_is_missing(change: dict[str, Any], words: str) -> None:
    why = qm.moe_plan(_with(moe_case("bf16", style="qwen"), **change))
    assert isinstance(why, str) and words in why, why


# --- reference activations, by hand ---------------------------------------------------------------------

def test_sqrtsoftplus_router_weights_by_hand() -> None:
    from operatorx.backends.vllm.reference import route_weights

    logits = torch.tensor([[0.0, 2.0, -1.0, 1.0]])
    # sqrt(softplus): sqrt(ln 2) = 0.832555, sqrt(ln(1 + e^2)) = sqrt(2.126928) = 1.458399
    w = route_weights(logits, torch.tensor([[1, 0]]), "sqrtsoftplus", False, None)
    assert torch.allclose(w, torch.tensor([[1.458399, 0.832555]]), atol=1e-5), w
    w = route_weights(logits, torch.tensor([[1, 0]]), "sqrtsoftplus", True, 1.5)
    assert torch.allclose(w, torch.tensor([[1.5 * 1.458399 / 2.290954, 1.5 * 0.832555 / 2.290954]]), atol=1e-5)


def test_hash_table_rows_are_distinct_experts_in_range() -> None:
    from operatorx.backends.vllm.moe_build import hash_table

    t = hash_table(1000, 16, 6, torch.Generator().manual_seed(1), chunk_rows=300)
    assert t.shape == (1000, 6) and t.dtype == torch.int32
    assert int(t.min()) >= 0 and int(t.max()) <= 15
    assert bool((t.long().sort(dim=1).values.diff(dim=1) > 0).all())
    assert len({tuple(r) for r in t.tolist()}) > 900        # rows differ: the table routes by token id


def _silu(v: float) -> float:
    return v / (1.0 + math.exp(-v))


def test_clamped_silu_reference_by_hand() -> None:
    # gate = [-1, 0, 2, 20], up = [3, -12, 0.5, 8]; limit 10: gate 20 → 10, up -12 → -10
    h = torch.tensor([[-1.0, 0.0, 2.0, 20.0, 3.0, -12.0, 0.5, 8.0]])
    out = gated_activation(h, Activation.model_validate({"kind": "silu", "limit": 10.0}))
    # silu(-1)·3 = -0.80682, silu(0)·-10 = 0, silu(2)·0.5 = 0.88080, silu(10)·8 = 79.99637
    want = [-0.8068243, 0.0, 0.8807971, 79.9963677]
    assert out.shape == (1, 4)
    assert torch.allclose(out[0], torch.tensor(want), rtol=1e-6, atol=1e-6), out
    unclamped = gated_activation(h, Activation.model_validate({"kind": "silu"}))
    assert math.isclose(float(unclamped[0, 3]), _silu(20.0) * 8, rel_tol=1e-6)      # 159.99999
    assert math.isclose(float(unclamped[0, 1]), 0.0, abs_tol=1e-7)


def test_swigluoai_interleaved_reference_by_hand() -> None:
    # interleaved rows: (gate, up) = (1, 2), (9, -8), (-3, 0.5)
    h = torch.tensor([[1.0, 2.0, 9.0, -8.0, -3.0, 0.5]])
    out = gated_activation(h, Activation.model_validate(OAI))
    sig = lambda v: 1.0 / (1.0 + math.exp(-v))  # noqa: E731
    # g·σ(1.702 g)·(u + 1); gate 9 → 7, up -8 → -7
    want = [1 * sig(1.702) * 3, 7 * sig(1.702 * 7) * (-6), -3 * sig(-1.702 * 3) * 1.5]
    assert [round(v, 4) for v in want] == [2.5374, -41.9997, -0.0271]      # σ(1.702) = 0.84578
    assert torch.allclose(out[0], torch.tensor(want), rtol=1e-5, atol=1e-6), out
    # the same numbers in halves layout (swigluoai_uninterleave)
    halves = torch.tensor([[1.0, 9.0, -3.0, 2.0, -8.0, 0.5]])
    out2 = gated_activation(halves, Activation.model_validate({**OAI, "interleaved": False}))
    assert torch.allclose(out2, out)


def test_moe_reference_applies_routed_scale_to_routed_output_only() -> None:
    """One token, one expert with weight 0.5, a shared expert: routed_scale scales the routed part."""
    h, inter = 4, 2
    eye = torch.zeros(2 * inter, h)
    eye[0, 0] = eye[1, 1] = eye[2, 2] = eye[3, 3] = 1.0        # gate = x[0:2], up = x[2:4]
    down = torch.zeros(h, inter)
    down[0, 0] = down[1, 1] = 1.0
    q1, q2 = quantize_matrix(eye, "bf16"), quantize_matrix(down, "bf16")
    ref = {"experts": [(q1, q2)], "shared": (q1, q2, None)}
    x = torch.tensor([[1.0, 2.0, 3.0, -1.0]])
    ids, w = torch.tensor([[0]]), torch.tensor([[0.5]])
    act = Activation.model_validate({"kind": "silu"})
    y1 = moe_reference(x, ids, w, ref, "bf16", act)["none"]
    y2 = moe_reference(x, ids, w, ref, "bf16", act, routed_scale=2.5)["none"]
    mlp = torch.tensor([_silu(1.0) * 3, _silu(2.0) * -1, 0.0, 0.0])
    mlp_bf16 = mlp.to(torch.bfloat16).float()
    assert torch.allclose(y1[0], 0.5 * mlp_bf16 + mlp_bf16, atol=1e-6)
    assert torch.allclose(y2[0], 2.5 * 0.5 * mlp_bf16 + mlp_bf16, atol=1e-6)


def test_a_bf16_shared_mlp_beside_quantized_experts_plans_and_other_mixes_stay_refused() -> None:
    plan = qm.moe_plan(_args(moe_case("fp8_block", "qwen", shared_bf16=True)))
    assert isinstance(plan, qm.Plan) and plan.shared_scheme == "bf16" and "ignored layers" in plan.notes[-1]
    same = qm.moe_plan(_args(moe_case("fp8_block", "qwen")))
    assert isinstance(same, qm.Plan) and same.shared_scheme is None
    a8, w8 = SCHEMES["fp8_block"]
    mixed = moe_case("bf16", "qwen").to_json()
    mixed["args"]["shared"].update({"a1": a8, "w1": w8, "w2": w8})
    why = qm.moe_plan(_args(Case.model_validate(mixed)))
    assert isinstance(why, str) and "differ" in why      # quantized shared beside bf16 experts: no such checkpoint


def test_block_fp8_experts_and_shared_mlp_may_run_different_activation_scales() -> None:
    """Triton experts and a FlashInfer shared-expert GEMM each pick their own scale flavor: every pair is
    offered, the agreeing ones under the flavor's own name."""
    gen = torch.Generator().manual_seed(4)
    rows, h, inter = 3, 256, 128
    x = torch.randn(rows, h, generator=gen).to(torch.bfloat16)
    experts = [(quantize_matrix(torch.randn(2 * inter, h, generator=gen) / 11, "fp8_block"),
                quantize_matrix(torch.randn(h, inter, generator=gen) / 11, "fp8_block")) for _ in range(2)]
    s1 = quantize_matrix(torch.randn(2 * inter, h, generator=gen) / 11, "fp8_block")
    s2 = quantize_matrix(torch.randn(h, inter, generator=gen) / 11, "fp8_block")
    ids = torch.tensor([[0, 1], [1, 0], [0, 1]])
    weights = torch.tensor([[0.75, 0.25], [0.5, 0.5], [1.0, 0.0]])
    act = Activation.model_validate({"kind": "silu", "gated": True})
    ref = {"experts": experts, "shared": (s1, s2, None)}
    out = moe_reference(x, ids, weights, ref, "fp8_block", act)
    assert set(out) == {"ue8m0", "fp32", "experts ue8m0, shared fp32", "experts fp32, shared ue8m0"}
    routed_only = moe_reference(x, ids, weights, {"experts": experts}, "fp8_block", act)
    shared_of = {f: out[f] - routed_only[f] for f in ("ue8m0", "fp32")}
    torch.testing.assert_close(out["experts ue8m0, shared fp32"], routed_only["ue8m0"] + shared_of["fp32"])
    torch.testing.assert_close(out["experts fp32, shared ue8m0"], routed_only["fp32"] + shared_of["ue8m0"])
    assert not torch.equal(out["experts ue8m0, shared fp32"], out["ue8m0"])
