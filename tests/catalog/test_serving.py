"""`testlist serving`'s cases: roles, tokens per rank and counts, hand-computed from the checkpoint files."""

from __future__ import annotations

import dataclasses

import pytest

from operatorx.catalog import CatalogError, find_checkpoints
from operatorx.catalog.arch import read_arch
from operatorx.catalog.serving import Scenario, scenario_cases, serving

pytestmark = pytest.mark.filterwarnings("ignore::operatorx.catalog.errors.CatalogWarning")


def _by(cases, step, role, kind=None):
    """The one case of `step` that cites `role` (the part after the checkpoint id)."""
    hits = [c for c in cases if c.step == step and any(s.endswith("/" + role) for s in c.sources)
            and (kind is None or c.type == kind)]
    assert len(hits) == 1, (step, role, [c.label() for c in hits])
    return hits[0]


def _gemm(case):
    return case.args.m, case.args.n, case.args.k, case.count


def _with_rope(model: str, **facts):
    """The catalog checkpoint and its arch plus RoPE facts the catalog does not hold (for attention)."""
    ckpt = find_checkpoints([model])[0]
    arch = read_arch({**ckpt.arch.config, **facts}, ckpt.arch.origin, dict(ckpt.arch.implementation))
    return ckpt, arch


def test_deepseek_v3_tp8_decode_and_prefill():
    # deepseek-v3.json: hidden 7168, 128 heads, q_lora 1536, kv_lora 512, nope 128, rope 64, v 128, 61 layers,
    # first_k_dense_replace 3 (58 MoE layers), intermediate 18432, moe 2048, 256 experts top-8, vocab 129280
    cases = serving("deepseek-v3", Scenario(isl=8192, osl=1024, conc=64, tp=8))
    d = "decode"
    assert _gemm(_by(cases, d, "self_attn.fused_qkv_a_proj")) == (64, 1536 + 512 + 64, 7168, 61)
    assert _gemm(_by(cases, d, "self_attn.q_b_proj")) == (64, 128 // 8 * (128 + 64), 1536, 61)
    assert _gemm(_by(cases, d, "self_attn.kv_b_proj")) == (64, 128 // 8 * (128 + 128), 512, 61)
    assert _gemm(_by(cases, d, "self_attn.o_proj")) == (64, 7168, 128 // 8 * 128, 61)
    assert _gemm(_by(cases, d, "mlp.gate_up_proj")) == (64, 2 * 18432 // 8, 7168, 3)
    assert _gemm(_by(cases, d, "mlp.down_proj")) == (64, 7168, 18432 // 8, 3)
    assert _gemm(_by(cases, d, "mlp.gate")) == (64, 256, 7168, 58)
    assert _gemm(_by(cases, d, "mlp.shared_experts.gate_up_proj")) == (64, 2 * 2048 // 8, 7168, 58)
    assert _gemm(_by(cases, d, "lm_head")) == (64, 129280 // 8, 7168, 1)
    moe = _by(cases, d, "mlp.experts", "moe")
    assert (moe.args.tokens, moe.args.experts.inter, moe.count, moe.parallel.split()) == (64, 2048, 58, {"tp": 8})
    reduce = _by(cases, d, "self_attn:all_reduce")
    assert (reduce.args.kind, reduce.args.elements, reduce.args.world) == ("all_reduce", 64 * 7168, 8)
    assert reduce.count == 61 + 3                            # after attention, the 3 dense MLPs (the MoE
    assert set(s.rsplit("/", 1)[1] for s in reduce.sources) == {"self_attn:all_reduce", "mlp:all_reduce"}
    # case is the whole layer over its tp8 ranks: its all-reduce is inside it, never a case of its own)
    assert not [c for c in cases if any(":" in s and "experts" in s.rsplit("/", 1)[1] for s in c.sources)]
    gather = _by(cases, d, "lm_head:all_gather")
    assert (gather.args.kind, gather.args.elements, gather.count) == ("all_gather", 64 * 129280, 1)
    # prefill: isl 8192 = one chunk, one request; lm_head over its last token
    p = "prefill"
    assert _gemm(_by(cases, p, "self_attn.fused_qkv_a_proj")) == (8192, 2112, 7168, 61)
    assert _gemm(_by(cases, p, "lm_head")) == (1, 16160, 7168, 1)
    assert _by(cases, p, "mlp.experts", "moe").args.tokens == 8192
    assert _by(cases, p, "self_attn:all_reduce").args.elements == 8192 * 7168
    assert {c.step for c in cases} == {"decode", "prefill"} and all(c.count >= 1 for c in cases)


def test_deepseek_v3_dp8_ep8_mtp1_its_moe_layer_holds_its_all_to_all():
    cases = serving("deepseek-v3", Scenario(isl=8192, osl=1024, conc=64, dp=8, ep=8, mtp=1))
    tokens = 64 // 8 * (1 + 1)                               # conc/dp requests, 1+mtp tokens each
    assert _gemm(_by(cases, "decode", "self_attn.q_b_proj")) == (tokens, 128 * 192, 1536, 61)
    assert _gemm(_by(cases, "decode", "lm_head")) == (tokens, 129280, 7168, 1)
    moe = _by(cases, "decode", "mlp.experts", "moe")
    assert (moe.args.tokens, moe.parallel.split()) == (tokens, {"dp": 8, "ep": 8})
    # dispatch and combine are inside the MoE case (the whole dp8·ep8 layer); tp 1: no all-reduce
    assert not [c for c in cases if c.type == "collective"]     # tp 1: nothing outside the layers


def test_deepseek_v3_mla_attention_batches():
    ckpt, arch = _with_rope("deepseek-v3", rope_theta=10000.0,
                            rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                                          "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0})
    cases = scenario_cases(ckpt, "fp8_block", Scenario(isl=8192, osl=1024, conc=64, tp=8), [], arch)
    decode = _by(cases, "decode", "self_attn", "mla")
    g = decode.args.batch.groups
    assert [(x.count, x.q, x.ctx) for x in g] == [(64, 1, 8192 + 1024 // 2)]
    assert (decode.args.heads, decode.args.q_lora_rank, decode.args.kv_lora_rank, decode.count) == (128, 1536, 512, 61)
    assert decode.parallel.split() == {"tp": 8} and decode.args.rope_scaling.original_max == 4096
    assert decode.args.proj["q_b_proj"].b.dtype == "e4m3"
    prefill = _by(cases, "prefill", "self_attn", "mla")
    assert [(x.count, x.q, x.ctx) for x in prefill.args.batch.groups] == [(1, 8192, 0)]


def test_qwen3_moe_tp2():
    # qwen3-30b-a3b.json: hidden 2048, 32 heads, 4 kv heads, head_dim 128, 48 layers (all MoE), 128 experts top-8,
    # moe_intermediate 768, vocab 151936
    ckpt, arch = _with_rope("Qwen3-30B-A3B-Base", rope_theta=1000000.0)
    sc = Scenario(isl=1024, osl=1024, conc=64, tp=2)
    cases = scenario_cases(ckpt, "bf16", sc, [], arch)
    assert _gemm(_by(cases, "decode", "self_attn.qkv_proj")) == (64, (16 + 2 * 2) * 128, 2048, 48)
    assert _gemm(_by(cases, "decode", "self_attn.o_proj")) == (64, 2048, 16 * 128, 48)
    assert _gemm(_by(cases, "decode", "mlp.gate")) == (64, 128, 2048, 48)
    assert _gemm(_by(cases, "decode", "lm_head")) == (64, 151936 // 2, 2048, 1)
    assert not [c for c in cases if any(s.endswith("/mlp.gate_up_proj") for s in c.sources)]   # no dense MLP
    moe = _by(cases, "decode", "mlp.experts", "moe")
    assert (moe.args.tokens, moe.args.experts.num, moe.args.experts.inter, moe.count) == (64, 128, 768, 48)
    reduce = _by(cases, "decode", "self_attn:all_reduce")
    # after every attention; the MoE layers' all-reduces are inside their (tp2) MoE cases
    assert (reduce.args.elements, reduce.args.world, reduce.count) == (64 * 2048, 2, 48)
    gqa = _by(cases, "decode", "self_attn", "gqa")
    assert (gqa.args.q_heads, gqa.args.kv_heads, gqa.args.head_dim, gqa.args.qk_norm) == (32, 4, 128, True)
    assert (gqa.count, gqa.parallel.split()) == (48, {"tp": 2})
    # prefill: 8192 // 1024 = 8 whole prompts in the chunk; lm_head over their 8 last tokens
    assert _gemm(_by(cases, "prefill", "self_attn.qkv_proj")) == (8192, 2560, 2048, 48)
    assert _gemm(_by(cases, "prefill", "lm_head")) == (8, 75968, 2048, 1)
    assert [(x.count, x.q, x.ctx) for x in _by(cases, "prefill", "self_attn", "gqa").args.batch.groups] == \
        [(8, 1024, 0)]


def test_llama_dense_tp1_and_tp2():
    # llama-3.1-8b.json: hidden 4096, 32 heads, 8 kv, head_dim 128, intermediate 14336, 32 layers, vocab 128256
    cases = serving("Llama-3.1-8B-Instruct", Scenario(isl=8192, osl=1024, conc=64))
    assert _gemm(_by(cases, "decode", "self_attn.qkv_proj")) == (64, (32 + 16) * 128, 4096, 32)
    assert _gemm(_by(cases, "decode", "mlp.gate_up_proj")) == (64, 2 * 14336, 4096, 32)
    assert _gemm(_by(cases, "decode", "mlp.down_proj")) == (64, 4096, 14336, 32)
    assert not [c for c in cases if c.type in ("collective", "moe")]          # one GPU: no exchange
    tp2 = serving("Llama-3.1-8B-Instruct", Scenario(isl=8192, osl=1024, conc=64, tp=2))
    assert _gemm(_by(tp2, "decode", "self_attn.qkv_proj")) == (64, (16 + 8) * 128, 4096, 32)
    reduce = _by(tp2, "decode", "self_attn:all_reduce")
    assert (reduce.args.elements, reduce.count) == (64 * 4096, 32 + 32)


def test_attention_left_out_without_rope_theta_says_so():
    with pytest.warns(UserWarning, match="attention not produced: config field 'rope_theta' is missing"):
        cases = serving("Llama-3.1-405B-Instruct", Scenario(isl=8192, osl=1024, conc=64))
    assert not [c for c in cases if c.family == "attention"]


@pytest.mark.parametrize(("isl", "chunk", "conc", "groups"), [
    (8192, 8192, 64, [(1, 8192, 0)]),
    (3000, 8192, 64, [(2, 3000, 0), (1, 2192, 0)]),          # two prompts and the first 2192 tokens of a third
    (1000, 8192, 2, [(2, 1000, 0)]),                         # only conc/dp prompts can be waiting
    (20000, 8192, 64, [(1, 8192, 8192)]),                     # 3 chunks: the mean one, after 8192*(3-1)//2
])
def test_prefill_chunk_rule(isl, chunk, conc, groups):
    batch = Scenario(isl=isl, osl=1, conc=conc, chunk=chunk).prefill_batch()
    assert [(g["count"], g["q"], g["ctx"]) for g in batch["groups"]] == groups


def test_identical_ops_merge_with_counts_summed():
    # qwen3.5-35b-a3b: 40 layers, full_attention_interval 4 -> 10 full, 30 linear; o_proj and out_proj are one shape
    cases = serving("qwen3.5-35b-a3b", Scenario(isl=1024, osl=1024, conc=64, tp=2))
    out = _by(cases, "decode", "self_attn.o_proj")
    assert out.count == 10 + 30 and any(s.endswith("/linear_attn.out_proj") for s in out.sources)
    assert _by(cases, "decode", "self_attn.qkv_proj").count == 10
    assert _by(cases, "decode", "linear_attn.in_proj_qkvz").count == 30


@pytest.mark.parametrize(("sc", "words"), [
    (Scenario(isl=8192, osl=1024, conc=64, tp=8, ep=4), "--ep 4: expert parallelism spans every rank or none"),
    (Scenario(isl=8192, osl=1024, conc=60, dp=8), "--dp 8 does not divide --conc 60"),
    (Scenario(isl=0, osl=1024, conc=64), "--isl must be a positive integer"),
    (Scenario(isl=8192, osl=1024, conc=64, mtp=-1), "--mtp must be a non-negative integer"),
    (Scenario(isl=8192, osl=1024, conc=64, tp=3), "tp=3 does not divide num_attention_heads=128"),
])
def test_bad_scenarios_are_one_line(sc, words):
    with pytest.raises(CatalogError) as err:
        serving("deepseek-v3", sc)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_unknown_model_and_ambiguous_family():
    with pytest.raises(CatalogError, match="unknown model 'no-such'"):
        serving("no-such", Scenario(isl=1, osl=1, conc=1))
    with pytest.raises(CatalogError, match="names .* checkpoints .*give one id"):
        serving("llama-3", Scenario(isl=1, osl=1, conc=1))


def test_scenario_is_recorded_in_metadata():
    sc = Scenario(isl=8192, osl=1024, conc=64, tp=8)
    case = serving("deepseek-v3", sc)[0]
    assert case.metadata["scenario"] == {"model": "deepseek-ai/DeepSeek-V3", "scheme": "fp8_block",
                                         **dataclasses.asdict(sc)}
