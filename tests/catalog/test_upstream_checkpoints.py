"""Issue 14 item 5: the checkpoints upstream moe_small uses, their computed shapes, and moe_small's
coverage of them (every one at tokens=1, one layer per family swept, FP8 layers under every
routing distribution). Expected sizes are worked out from the data files' config values."""

from __future__ import annotations

import json
import warnings
from importlib import resources

import pytest

from operatorx.catalog import CatalogError, CatalogWarning, build_shipped, generate, load_catalog, testlists
from operatorx.catalog.checkpoints import _parse
from operatorx.catalog.moe_layer import ROUTING_DISTRIBUTIONS
from operatorx.spec.gemm import GemmArgs
from operatorx.spec.moe import MoeArgs

ADDED = ("Qwen/Qwen3.5-397B-A17B-FP8", "zai-org/GLM-5.1-FP8", "zai-org/GLM-5.2-FP8", "moonshotai/Kimi-K2.5",
         "moonshotai/Kimi-K2.6", "MiniMaxAI/MiniMax-M3-MXFP8", "nvidia/MiniMax-M3-NVFP4",
         "deepseek-ai/DeepSeek-V4.1-Flash", "moonshotai/Kimi-K3",
         # MoE-only variants: the layer as the upstream list has it, the other role groups not_produced
         "nvidia/Qwen3.5-397B-A17B-NVFP4", "amd/Qwen3.5-397B-A17B-MXFP4", "Qwen/Qwen3.8-Flash-Next-FP8",
         "RadixArk/Qwen3.8-Flash-Next-NVFP4", "nvidia/GLM-5.1-NVFP4", "nvidia/GLM-5.2-NVFP4", "amd/GLM-5.1-MXFP4",
         "amd/GLM-5.2-MXFP4", "zai-org/GLM-5.3", "nvidia/Kimi-K2.5-NVFP4", "nvidia/Kimi-K2.6-NVFP4",
         "amd/Kimi-K2.5-MXFP4", "amd/MiniMax-M3-MXFP4", "nvidia/MiniMax-M2.5-NVFP4", "amd/MiniMax-M2.5-MXFP4")


def _gemms(model: str, tp: int) -> dict[str, GemmArgs]:
    out = {}
    for case in generate([model], [tp], [1]):
        for src in case.sources:
            if src.startswith(model + "/") and isinstance(case.args, GemmArgs):
                out[src[len(model) + 1:]] = case.args
    return out


def _moe(model: str, tp: int) -> MoeArgs:
    (case,) = [c for c in generate([model], [tp], [1], moe_tokens=[1]) if c.type == "moe"]
    assert isinstance(case.args, MoeArgs)
    return case.args


def test_qwen35_fp8_stores_bf16_block_scales_and_keeps_in_proj_ba_and_gates_bf16():
    g = _gemms("Qwen/Qwen3.5-397B-A17B-FP8", 4)
    qkvz = g["linear_attn.in_proj_qkvz"]
    # 2 * (16/4 key heads * 128) + 2 * (64/4 value heads * 128) = 1024 + 4096
    assert (qkvz.n, qkvz.k, qkvz.b.dtype) == (5120, 4096, "e4m3")
    assert qkvz.b.scale is not None and (qkvz.b.scale.dtype, qkvz.b.scale.group) == ("bf16", [128, 128])
    assert qkvz.a.scale is not None and (qkvz.a.scale.dtype, qkvz.a.scale.group, qkvz.a.scale.static) == \
        ("fp32", [1, 128], False)
    assert (g["linear_attn.in_proj_ba"].n, g["linear_attn.in_proj_ba"].b.dtype) == (2 * 64 // 4, "bf16")
    for role in ("mlp.gate", "mlp.shared_expert_gate", "lm_head"):
        assert g[role].b.dtype == "bf16", role
    moe = _moe("Qwen/Qwen3.5-397B-A17B-FP8", 4)
    assert (moe.experts.num, moe.experts.top_k, moe.experts.inter) == (512, 10, 1024 // 4)
    assert moe.shared is not None and moe.shared.inter == 1024 // 4 and moe.shared.gate == "sigmoid"
    assert moe.experts.w1.scale is not None and moe.experts.w1.scale.dtype == "bf16"


def test_the_bf16_qwen35_keeps_in_proj_ba_with_attention():
    """linear_attn_ba follows attn_qkv unless a scheme names it: the bf16 release is unchanged."""
    assert _gemms("Qwen/Qwen3.5-397B-A17B", 8)["linear_attn.in_proj_ba"].b.dtype == "bf16"


def test_kimi_k25_k26_quantize_only_the_routed_experts_to_int4_per_32():
    for model in ("moonshotai/Kimi-K2.5", "moonshotai/Kimi-K2.6"):
        assert {r: a.b.dtype for r, a in _gemms(model, 8).items()} == dict.fromkeys(
            ["self_attn.fused_qkv_a_proj", "self_attn.q_b_proj", "self_attn.kv_b_proj", "self_attn.o_proj",
             "mlp.gate_up_proj", "mlp.down_proj", "mlp.gate", "mlp.shared_experts.gate_up_proj",
             "mlp.shared_experts.down_proj", "lm_head"], "bf16")
        moe = _moe(model, 8)
        w1 = moe.experts.w1
        assert (w1.dtype, moe.experts.a1.dtype, moe.experts.inter) == ("int4", "bf16", 2048 // 8)
        assert w1.scale is not None and (w1.scale.dtype, w1.scale.group) == ("bf16", [1, 32])
        assert moe.shared is not None and moe.shared.w1.dtype == "bf16"


def test_glm5x_fp8_is_glm5_with_block_fp8():
    bf16, fp8 = _moe("zai-org/GLM-5", 8), _moe("zai-org/GLM-5.2-FP8", 8)
    assert (fp8.hidden, fp8.experts.num, fp8.experts.top_k, fp8.experts.inter) == (6144, 256, 8, 2048 // 8)
    assert fp8.router == bf16.router and fp8.router.gate.logits == "fp32"
    assert fp8.experts.w1.scale is not None and fp8.experts.w1.scale.group == [128, 128]
    assert _moe("zai-org/GLM-5.1-FP8", 8) == fp8


def test_minimax_m3_runs_uninterleaved_swigluoai_with_an_fp32_router_and_a_shared_expert():
    moe = _moe("MiniMaxAI/MiniMax-M3-MXFP8", 4)
    act = moe.activation
    assert (act.kind, act.interleaved, act.alpha, act.beta, act.limit) == ("swigluoai", False, 1.702, 1.0, 7.0)
    assert (moe.router.gate.dtype, moe.router.gate.logits, moe.router.scale) == ("fp32", "fp32", 2.0)
    assert (moe.experts.num, moe.experts.top_k, moe.experts.inter) == (128, 4, 3072 // 4)
    assert moe.shared is not None and moe.shared.inter == 3072 // 4 and moe.shared.gate is None
    w1 = moe.experts.w1
    assert w1.dtype == "e4m3" and w1.scale is not None and (w1.scale.dtype, w1.scale.group) == ("ue8m0", [1, 32])
    g = _gemms("MiniMaxAI/MiniMax-M3-MXFP8", 4)
    # 64/4 query heads and 4/4 KV heads of 128: 16*128 + 2*1*128
    assert (g["self_attn.qkv_proj"].n, g["self_attn.qkv_proj"].k) == (2304, 6144)
    assert (g["mlp.gate"].a.dtype, g["mlp.gate"].out) == ("fp32", "fp32")


def test_minimax_m3_nvfp4_changes_only_the_routed_experts():
    mx, nv = _moe("MiniMaxAI/MiniMax-M3-MXFP8", 4), _moe("nvidia/MiniMax-M3-NVFP4", 4)
    assert (nv.experts.w1.dtype, nv.experts.a1.dtype) == ("e2m1", "e2m1")
    assert nv.experts.w1.scale is not None and nv.experts.w1.scale.group == [1, 16] and nv.experts.w1.scale2
    assert nv.shared == mx.shared and nv.router == mx.router and nv.activation == mx.activation


def test_deepseek_v41_flash_produces_only_what_it_shares_with_v4():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CatalogWarning)
        g = _gemms("deepseek-ai/DeepSeek-V4.1-Flash", 8)
    assert not [str(w.message) for w in caught]
    assert set(g) == {"attn.fused_wqa_wkv", "attn.wq_b", "attn.wo_a", "attn.wo_b", "ffn.gate",
                      "ffn.shared_experts.gate_up_proj", "ffn.shared_experts.down_proj", "lm_head"}
    assert (g["attn.fused_wqa_wkv"].n, g["attn.wo_a"].k) == (1280 + 512, 64 * 512 // 8)
    wq_b = g["attn.wq_b"]
    assert wq_b.b.scale is not None and (wq_b.b.scale.dtype, wq_b.b.scale.group) == ("ue8m0", [32, 32])
    assert wq_b.a.scale is not None and wq_b.a.scale.group == [1, 32]
    moe = _moe("deepseek-ai/DeepSeek-V4.1-Flash", 8)
    assert (moe.experts.num, moe.experts.top_k, moe.experts.inter) == (384, 6, 2304 // 8)
    assert (moe.router.scoring, moe.router.scale, moe.activation.limit) == ("sqrtsoftplus", 1.5, 10.0)
    assert moe.router.select.kind == "topk" and moe.experts.w1.dtype == "e2m1" and moe.experts.a1.dtype == "bf16"


def test_moe_only_variants_produce_the_gate_and_shared_expert_and_nothing_else():
    g = _gemms("nvidia/Qwen3.5-397B-A17B-NVFP4", 4)
    assert set(g) == {"mlp.gate", "mlp.shared_expert.gate_up_proj", "mlp.shared_expert.down_proj",
                      "mlp.shared_expert_gate"}
    assert g["mlp.shared_expert.gate_up_proj"].b.dtype == "bf16" and g["mlp.shared_expert.down_proj"].k == 1024 // 4
    moe = _moe("Qwen/Qwen3.8-Flash-Next-FP8", 1)
    assert (moe.hidden, moe.experts.num, moe.experts.top_k, moe.experts.inter) == (2560, 512, 10, 640)
    assert moe.experts.w1.scale is not None and moe.experts.w1.scale.dtype == "bf16"
    assert moe.shared is not None
    assert (moe.shared.inter, moe.shared.w1.dtype, moe.shared.gate) == (640, "bf16", "sigmoid")
    glm = _moe("nvidia/GLM-5.2-NVFP4", 8)
    assert glm.experts.w1.dtype == "e2m1" and glm.shared is not None and glm.shared.w1.dtype == "bf16"
    mx = _moe("amd/GLM-5.2-MXFP4", 8)
    assert mx.shared is not None and mx.shared.w1.dtype == "e2m1"


def test_kimi_k3_is_a_latent_moe_with_situ_and_two_bf16_shared_experts():
    moe = _moe("moonshotai/Kimi-K3", 8)
    e = moe.experts
    assert (e.num, e.top_k, e.inter, e.latent, e.latent_norm) == (896, 16, 3072 // 8, 3584, True)
    assert (e.w1.dtype, e.a1.dtype) == ("e2m1", "bf16")
    act = moe.activation
    assert (act.kind, act.alpha, act.beta, act.limit) == ("situ", 4.0, 25.0, None)
    r = moe.router
    assert (r.gate.dtype, r.gate.logits, r.scoring, r.bias, r.renormalize, r.scale) == \
        ("bf16", "fp32", "sigmoid", True, True, 1.0)
    assert r.select.kind == "grouped_topk" and (r.select.groups, r.select.topk_groups) == (1, 1)
    # num_shared_experts 2 of 3072, split over 8 ranks: one shared block of 2*3072/8
    assert moe.shared is not None and (moe.shared.inter, moe.shared.w1.dtype) == (2 * 3072 // 8, "bf16")
    assert "self_attn.kv_b_proj" not in _gemms("moonshotai/Kimi-K3", 8)


def test_only_a_latent_config_gets_latent_fields():
    assert _moe("moonshotai/Kimi-K2.6", 8).experts.latent is None


def test_not_produced_must_name_a_role_group_and_a_reason():
    data = json.loads(next(p for p in _checkpoint_files() if p.name == "deepseek-v4.1-flash.json").read_text())
    for bad in ({"compressor": "typo"}, {"hyper_connections": ""}, ["hyper_connections"]):
        with pytest.raises(CatalogError, match="not_produced maps role groups"):
            _parse({**data, "not_produced": bad}, "x.json")


def _checkpoint_files():
    return list((resources.files("operatorx.catalog") / "checkpoints").iterdir())


# --- moe_small coverage ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def moe_small():
    return build_shipped()["moe_small"]


def _by_checkpoint(cases) -> dict[str, list[MoeArgs]]:
    out: dict[str, list[MoeArgs]] = {}
    for case in cases:
        for src in case.sources:
            out.setdefault(src.split("/mlp.")[0].split("/ffn.")[0], []).append(case.args)
    return out


def test_moe_small_has_every_added_checkpoint_at_one_token(moe_small):
    seen = _by_checkpoint(moe_small)
    for model in ADDED:
        assert any(a.tokens == 1 and a.routing.name == "natural" for a in seen[model]), model


def test_moe_small_sweeps_exactly_one_checkpoint_per_family(moe_small):
    """Per family: its sweep pick runs 8/64/512/2048; besides it only the routing-sweep checkpoints do."""
    seen = _by_checkpoint(moe_small)
    picks = testlists._sweep_picks()
    swept: dict[str, list[str]] = {}
    for ckpt in load_catalog():
        if ckpt.arch.is_moe and {8, 64, 512, 2048} <= {a.tokens for a in seen.get(ckpt.id, [])}:
            assert ckpt.id in picks or ckpt.moe_routing_sweep, ckpt.id
            if ckpt.id in picks:
                swept.setdefault(ckpt.family, []).append(ckpt.id)
    families = {c.family for c in load_catalog() if c.arch.is_moe}
    assert set(swept) == families and all(len(ids) == 1 for ids in swept.values()), swept
    assert swept["kimi-k2"] == ["moonshotai/Kimi-K2-Instruct"] and swept["glm-5"] == ["zai-org/GLM-5"]
    assert swept["minimax-m3"] == ["MiniMaxAI/MiniMax-M3-MXFP8"]
    assert swept["deepseek-v4.1"] == ["deepseek-ai/DeepSeek-V4.1-Flash"]
    assert swept["kimi-k3"] == ["moonshotai/Kimi-K3"] and swept["minimax-m2"] == ["MiniMaxAI/MiniMax-M2.5"]


def test_moe_small_routes_the_r1_and_qwen35_fp8_layers_every_way(moe_small):
    seen = _by_checkpoint(moe_small)
    want = {(t, _dist_name(d)) for t in (1, 8, 64, 512, 2048) for d in ROUTING_DISTRIBUTIONS}
    for model in ("deepseek-ai/DeepSeek-R1-0528", "Qwen/Qwen3.5-397B-A17B-FP8"):
        assert want <= {(a.tokens, a.routing.name) for a in seen[model]}, model


def _dist_name(dist) -> str:
    """The name Routing gives a distribution (`zipf1.2` for {"kind": "zipf", "s": 1.2})."""
    return dist if isinstance(dist, str) else f"zipf{dist['s']:g}"


def test_a_sweep_pick_the_catalog_lacks_is_refused(monkeypatch):
    monkeypatch.setitem(testlists.MOE_SWEEP, "glm-5", "zai-org/GLM-9")
    with pytest.raises(CatalogError, match="zai-org/GLM-9"):
        testlists._sweep_picks()


def test_a_sweep_key_that_is_no_moe_family_is_refused(monkeypatch):
    # a misspelt family would otherwise sweep its pick and the family's first data file both
    monkeypatch.setitem(testlists.MOE_SWEEP, "glm5", "zai-org/GLM-5")
    with pytest.raises(CatalogError, match="MOE_SWEEP key 'glm5' is no MoE checkpoint family") as err:
        testlists._sweep_picks()
    assert "glm-5" in str(err.value) and "\n" not in str(err.value)       # the known families, on one line


def test_a_sweep_pick_of_another_family_is_refused(monkeypatch):
    monkeypatch.setitem(testlists.MOE_SWEEP, "glm-5", "moonshotai/Kimi-K2-Instruct")
    with pytest.raises(CatalogError, match="MOE_SWEEP key 'glm-5' names moonshotai/Kimi-K2-Instruct, a "
                                           "checkpoint of family 'kimi-k2'"):
        testlists._sweep_picks()


def test_every_shipped_sweep_key_is_the_family_of_its_pick():
    family_of = {c.id: c.family for c in load_catalog() if c.arch.is_moe}
    assert {family_of[pick] for pick in testlists.MOE_SWEEP.values()} == set(testlists.MOE_SWEEP)
    assert testlists._sweep_picks() >= set(testlists.MOE_SWEEP.values())
