"""Attention projections through vLLM: the one plan a module's projections share, their stored form and
what the reference reads back, on the CPU (no vLLM needed)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from operatorx.backends.check import fp8_projection_bound
from operatorx.backends.vllm.attention.proj import activation, flavors, store
from operatorx.backends.vllm.attention.support import projection_bound, projection_plan
from operatorx.backends.vllm.reference import act_quant_dequant
from operatorx.backends.vllm.weights import quantize_matrix
from operatorx.spec import Case

ACT = {"dtype": "e4m3", "scale": {"dtype": "fp32", "group": [1, 128], "static": False}}
TOKEN = {"dtype": "e4m3", "scale": {"dtype": "fp32", "group": [1, -1], "static": False}}
BLOCK_W = {"dtype": "e4m3", "scale": {"dtype": "fp32", "group": [128, 128], "static": True}}
MXFP8 = {"a": {"dtype": "e4m3", "scale": {"dtype": "ue8m0", "group": [1, 32], "static": False}},
         "b": {"dtype": "e4m3", "scale": {"dtype": "ue8m0", "group": [1, 32], "static": True}}}
GQA = {"hidden": 256, "q_heads": 8, "kv_heads": 2, "head_dim": 128, "rope_dim": 64, "rope_theta": 1e4,
       "batch": {"groups": [{"count": 2, "q": 1, "ctx": 40}]}}
MLA = {"hidden": 512, "heads": 4, "q_lora_rank": 256, "kv_lora_rank": 128, "nope": 64, "rope_dim": 32, "v": 64,
       "rope": True, "rope_theta": 1e4, "batch": {"groups": [{"count": 2, "q": 1, "ctx": 40}]}}
GQA_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLA_NAMES = ("q_a_proj", "kv_a_proj_with_mqa", "q_b_proj", "kv_b_proj", "o_proj")


def _case(kind: str, proj: dict[str, Any]) -> Case:
    args = {**(GQA if kind == "gqa" else MLA), "proj": proj}
    return Case.model_validate({"type": kind, "args": args, "sources": ["org/model/self_attn"]})


@pytest.mark.parametrize(("kind", "names"), [("gqa", GQA_NAMES), ("mla", MLA_NAMES)])
def test_block_fp8_on_every_projection_is_one_fp8_plan(kind, names):
    case = _case(kind, {n: {"a": ACT, "b": BLOCK_W} for n in names})
    plan = projection_plan(case.args)
    assert not isinstance(plan, str), plan
    assert plan.scheme == "fp8_block" and plan.quant is not None and plan.quant.cls == "Fp8Config"
    assert plan.quant.config["weight_block_size"] == [128, 128]
    assert projection_bound(case.args) == fp8_projection_bound(kind)
    assert fp8_projection_bound(kind) == pytest.approx(3e-2 * (2 if kind == "gqa" else 4) ** 0.5)
    assert flavors(plan) == ("ue8m0", "fp32")


def test_no_proj_is_bf16_and_leaves_the_module_bound():
    case = _case("gqa", {})
    plan = projection_plan(case.args)
    assert not isinstance(plan, str) and plan.scheme == "bf16" and plan.quant is None
    assert projection_bound(case.args) == 0.0


def test_an_mla_without_gate_has_no_g_proj_to_miss():
    case = _case("mla", {n: {"a": ACT, "b": BLOCK_W} for n in MLA_NAMES})
    assert not case.args.gate
    assert not isinstance(projection_plan(case.args), str)


@pytest.mark.parametrize(("proj", "words"), [
    ({"q_proj": {"a": ACT, "b": BLOCK_W}}, "proj: q_proj=fp8_block, k_proj=bf16"),
    ({n: MXFP8 for n in GQA_NAMES}, "proj.q_proj: MXFP8"),
    ({n: {"a": TOKEN, "b": {"dtype": "e4m3", "scale": {"dtype": "fp32", "group": [-1, -1], "static": True}}}
      for n in GQA_NAMES}, "fp8_token_tensor attention projections are not loaded"),
])
def test_what_cannot_be_one_plan_is_refused_by_field(proj, words):
    why = projection_plan(_case("gqa", proj).args)
    assert isinstance(why, str) and words in why, why


def test_stored_block_fp8_reads_back_exactly_in_bf16():
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(384, 256, generator=gen) / 16).to(torch.bfloat16)
    plan = projection_plan(_case("gqa", {n: {"a": ACT, "b": BLOCK_W} for n in GQA_NAMES}).args)
    assert not isinstance(plan, str)
    s = store(w, plan)
    assert s.tensors["weight"].dtype == torch.float8_e4m3fn and s.tensors["weight_scale_inv"].shape == (3, 2)
    assert s.weight.dtype == torch.bfloat16
    rel = float((s.weight.float() - w.float()).norm() / w.float().norm())
    assert 5e-3 < rel < 6e-2, rel                 # e4m3 rounding, not the bf16 weight itself


def test_a_merged_matrix_stores_each_shard_as_its_own_blocks():
    """qkv_proj / fused_qkv_a_proj hold [q; k; v] as one matrix: with 128-row aligned shards its blocks
    are the shards' blocks, so quantizing the concatenation is what a checkpoint's shards load as."""
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(256, 256, generator=gen), torch.randn(128, 256, generator=gen) * 3
    whole = quantize_matrix(torch.cat([q, k]), "fp8_block")
    parts = [quantize_matrix(t, "fp8_block") for t in (q, k)]
    assert torch.equal(whole.q.float(), torch.cat([p.q.float() for p in parts]))
    assert whole.scale is not None and parts[0].scale is not None and parts[1].scale is not None
    assert torch.equal(whole.scale, torch.cat([parts[0].scale, parts[1].scale]))


def test_activation_quantizes_the_last_dim_in_1x128_groups():
    plan = projection_plan(_case("gqa", {n: {"a": ACT, "b": BLOCK_W} for n in GQA_NAMES}).args)
    assert not isinstance(plan, str)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 5, 256, generator=gen)
    got = activation(plan, "fp32")(x)
    assert got.shape == x.shape
    assert torch.equal(got.reshape(15, 256), act_quant_dequant(x.reshape(15, 256), "fp8_block", "fp32"))
    rel = float((got - x).norm() / x.norm())
    assert 5e-3 < rel < 6e-2, rel
    bf16 = projection_plan(_case("gqa", {}).args)
    assert not isinstance(bf16, str)
    assert torch.equal(activation(bf16, "none")(x), x)
