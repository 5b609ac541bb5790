"""Attention op types' FLOPs and fewest bytes (spec/attention.py, spec/attention_cost.py).

Expected values are written out from the formulas of docs/case-format.md ("Attention types: FLOPs
and bytes") with explicit per-token loops, never through the closed form the code uses; one case is
counted multiply-add by multiply-add on a literal computation.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from operatorx.run.case_gate import case_refusal
from operatorx.run.plan import estimated_s, longest_first
from operatorx.spec import Case
from operatorx.spec.attention_cost import AttentionCost, attended
from operatorx.spec.shard import ShardRefused
from tests.conftest import gemm

UPSTREAM = Path(__file__).parent / "upstream"


def case(type_: str, batch: list[dict[str, Any]], **args: Any) -> Case:
    return Case.model_validate({"type": type_, "args": {**args, "batch": {"groups": batch}}})


def keys(ctx: float, q: int, cap: int | None = None, ratio: int = 1) -> Fraction:
    """Σ_j min((ctx + j)/ratio, cap), one new token at a time."""
    total = Fraction(0)
    for j in range(1, q + 1):
        seen = (Fraction(ctx) + j) / ratio
        total += seen if cap is None else min(seen, Fraction(cap))
    return total


GQA = dict(hidden=64, q_heads=4, kv_heads=2, head_dim=16, rope_dim=16, rope_theta=1e4)


# ---- a literal count -------------------------------------------------------------------------

class Counter:
    def __init__(self) -> None:
        self.macs = 0

    def dot(self, a: list[float], b: list[float]) -> float:
        self.macs += len(a)
        return sum(x * y for x, y in zip(a, b, strict=True))


def literal_gqa_macs(hidden: int, q_heads: int, kv_heads: int, d: int, q: int, ctx: int) -> int:
    """Run a tiny GQA module on numbers and count every multiply-add it makes."""
    c = Counter()
    x = [[0.01 * (t + i) for i in range(hidden)] for t in range(q)]
    w = lambda rows, cols: [[0.001 * (r - k) for k in range(cols)] for r in range(rows)]  # noqa: E731
    wq, wk, wv, wo = w(q_heads * d, hidden), w(kv_heads * d, hidden), w(kv_heads * d, hidden), w(hidden, q_heads * d)
    cache_k = [[[0.1] * d for _ in range(kv_heads)] for _ in range(ctx)]
    cache_v = [[[0.2] * d for _ in range(kv_heads)] for _ in range(ctx)]
    for t in range(q):
        qv = [c.dot(row, x[t]) for row in wq]
        kv = [c.dot(row, x[t]) for row in wk]
        vv = [c.dot(row, x[t]) for row in wv]
        cache_k.append([kv[h * d:(h + 1) * d] for h in range(kv_heads)])
        cache_v.append([vv[h * d:(h + 1) * d] for h in range(kv_heads)])
        out: list[float] = []
        for h in range(q_heads):
            g = h // (q_heads // kv_heads)
            qh = qv[h * d:(h + 1) * d]
            scores = [c.dot(qh, cache_k[p][g]) for p in range(ctx + t + 1)]   # causal: up to itself
            acc = [0.0] * d
            for p, s in enumerate(scores):
                for i in range(d):
                    c.macs += 1
                    acc[i] += s * cache_v[p][g][i]
            out += acc
        _ = [c.dot(row, out) for row in wo]
    return c.macs


def test_gqa_flops_match_a_literal_count_of_multiply_adds():
    hidden, qh, kvh, d, q, ctx = 8, 4, 2, 4, 3, 2
    got = case("gqa", [{"count": 1, "q": q, "ctx": ctx}], hidden=hidden, q_heads=qh, kv_heads=kvh, head_dim=d,
               rope_dim=d, rope_theta=1e4)
    assert got.flops() == 2 * literal_gqa_macs(hidden, qh, kvh, d, q, ctx)


# ---- one small case per type -----------------------------------------------------------------

def test_gqa_cost_by_part():
    c = case("gqa", [{"count": 2, "q": 3, "ctx": 5}], **GQA).args.cost()
    t = 6
    assert c.projection_flops == 2 * t * (64 * 64 + 2 * 64 * 32 + 64 * 64)
    assert c.attention_flops == 2 * 4 * (2 * 16 + 2 * 16) * (6 + 7 + 8)         # QKᵀ + PV per key
    assert c.projection_bytes == (64 * 64 + 2 * 64 * 32 + 64 * 64) * 2 + 2 * t * 64 * 2
    assert c.cache_bytes == 2 * (5 + 3) * (2 * 2 * 16 * 2)                     # K and V, bf16
    assert c.state_bytes == 0


def test_gqa_gate_doubles_q_proj():
    plain = case("gqa", [{"count": 1, "q": 2, "ctx": 0}], **GQA).args.cost()
    gated = case("gqa", [{"count": 1, "q": 2, "ctx": 0}], **GQA, gate=True).args.cost()
    assert gated.projection_flops - plain.projection_flops == 2 * 2 * 64 * 64
    assert gated.projection_bytes - plain.projection_bytes == 64 * 64 * 2


def test_qsa_attends_its_budget_and_scores_compressed_keys():
    c = case("qsa", [{"count": 1, "q": 2, "ctx": 20}], **GQA, index_heads=2, index_dim=8, compress=4,
             budget=8).args.cost()
    assert c.projection_flops == 2 * 2 * (64 * 128 + 2 * 64 * 32 + 64 * 64 + 64 * 3 * 8)
    attention = 4 * 4 * 16 * keys(20, 2, cap=8)
    indexer = 2 * 2 * 8 * keys(20, 2, ratio=4)
    assert keys(20, 2, cap=8) == 16 and c.attention_flops == round(attention + indexer)
    assert c.cache_bytes == round((8 + 2) * 2 * 32 * 2 + Fraction(22, 4) * 8 * 2)


MLA = dict(hidden=64, heads=2, q_lora_rank=32, kv_lora_rank=16, nope=8, rope_dim=4, v=8, rope_theta=1e4)
MLA_PROJ = 64 * 32 + 64 * 20 + 32 * 2 * 12 + 16 * 2 * 16 + 2 * 8 * 64


def test_mla_decode_counts_the_absorbed_form():
    c = case("mla", [{"count": 3, "q": 1, "ctx": 100}], **MLA).args.cost()
    absorbed = 2 * 2 * (16 + 4 + 16) * 101            # QKᵀ over latent + rope, PV over the latent
    up_projected = 2 * 2 * (12 + 8) * 101 + 2 * 100 * 16 * 2 * 16
    assert absorbed < up_projected
    assert c.attention_flops == 3 * absorbed
    assert c.projection_flops == 2 * 3 * MLA_PROJ
    assert c.cache_bytes == 3 * (100 + 1) * (16 + 4) * 2


def test_mla_prefill_counts_the_up_projected_form():
    c = case("mla", [{"count": 1, "q": 64, "ctx": 0}], **MLA).args.cost()
    absorbed = 2 * 2 * 36 * keys(0, 64)
    up_projected = 2 * 2 * (12 + 8) * keys(0, 64)     # no cached latent to up-project
    assert up_projected < absorbed and c.attention_flops == up_projected
    assert c.projection_flops == 2 * 64 * MLA_PROJ


def test_mla_gate_adds_g_proj():
    plain = case("mla", [{"count": 1, "q": 1, "ctx": 8}], **MLA).args.cost()
    gated = case("mla", [{"count": 1, "q": 1, "ctx": 8}], **MLA, gate=True).args.cost()
    assert gated.projection_flops - plain.projection_flops == 2 * 64 * 2 * 8


DSA = dict(MLA, topk=32, index_heads=2, index_dim=16)


def test_mla_dsa_caps_attention_at_topk_and_its_indexer_scores_every_key():
    c = case("mla_dsa", [{"count": 1, "q": 1, "ctx": 1000}], **DSA).args.cost()
    assert c.attention_flops == 2 * 2 * 36 * 32 + 2 * 2 * 16 * 1001
    assert c.projection_flops == 2 * (MLA_PROJ + 32 * 32 + 64 * 16 + 64 * 2)
    index_key = 16 + 4                                   # fp8 index_dim + one fp32 scale
    assert c.cache_bytes == (32 + 1) * 20 * 2 + (1000 + 1) * index_key


def test_a_reused_topk_reads_indices_and_runs_no_indexer():
    near = case("mla_dsa", [{"count": 2, "q": 1, "ctx": 1000}], **DSA, indexer="reuse").args.cost()
    far = case("mla_dsa", [{"count": 2, "q": 1, "ctx": 2000}], **DSA, indexer="reuse").args.cost()
    assert near == far                                   # capped at topk: the context no longer matters
    assert near.attention_flops == 2 * 2 * 2 * 36 * 32
    assert near.cache_bytes == 2 * (32 + 1) * 40 + 2 * 32 * 4


def test_fp8_ds_mla_is_656_bytes_a_token_for_deepseek_sizes():
    dims = dict(hidden=64, heads=1, q_lora_rank=16, kv_lora_rank=512, nope=8, rope_dim=64, v=8, rope_theta=1e4,
                topk=2048, index_heads=1, index_dim=128, indexer="reuse", kv_cache_dtype="fp8_ds_mla")
    a, b = (case("mla_dsa", [{"count": 1, "q": 1, "ctx": n}], **dims).args.cost() for n in (100, 101))
    assert b.cache_bytes - a.cache_bytes == 512 + 4 * 4 + 64 * 2


DSV4 = dict(hidden=64, heads=4, head_dim=32, rope_dim=8, q_lora_rank=16, window=4, o_groups=2, o_lora_rank=8,
            kv_cache_dtype="fp8")


def test_dsv4_ratio_4_window_plus_topk_compressed_with_its_indexer():
    c = case("dsv4_attn", [{"count": 1, "q": 4, "ctx": 40}], **DSV4, compress_ratio=4, indexer="own", topk=3,
             index_heads=2, index_dim=8, compress_rope_theta=1e4).args.cost()
    t, per_token, index_key = 4, 24 + 1 + 1 + 8 * 2, 8 + 4
    proj = (64 * 16 + 64 * 32 + 16 * 128 + 64 * 16 + 16 * 64        # wq_a wkv wq_b wo_a wo_b
            + 2 * 64 * 64                                          # compressor wkv + wgate (coff 2)
            + 16 * 16 + 64 * 2 + 2 * 64 * 16)                       # indexer wq_b, weights, its compressor
    assert c.projection_flops == 2 * t * proj
    window, compressed = keys(40, 4, cap=4), keys(40, 4, cap=3, ratio=4)
    assert window == 16 and compressed == 12
    assert c.attention_flops == round(4 * 4 * 32 * (window + compressed) + 2 * 2 * 8 * keys(40, 4, ratio=4))
    moved = (3 + 4) + (3 + Fraction(4, 4))                         # window read + written, compressed
    assert c.cache_bytes == round(moved * per_token + (Fraction(40, 4) + Fraction(4, 4)) * index_key)
    assert c.state_bytes == t * 2 * 2 * 32 * 4 * 3 + t * 2 * 2 * 8 * 4 * 3


def test_dsv4_ratio_128_attends_every_compressed_token_and_ratio_0_only_its_window():
    c128 = case("dsv4_attn", [{"count": 1, "q": 1, "ctx": 1280}], **DSV4, compress_ratio=128,
                compress_rope_theta=1e4).args.cost()
    assert c128.attention_flops == round(4 * 4 * 32 * (4 + Fraction(1281, 128)))
    c0 = case("dsv4_attn", [{"count": 1, "q": 1, "ctx": 1280}], **DSV4, compress_ratio=0).args.cost()
    assert c0.attention_flops == 4 * 4 * 32 * 4 and c0.state_bytes == 0
    assert c0.cache_bytes == (3 + 1) * 42


def test_dsv4_bf16_cache_is_head_dim_bf16():
    args = dict(DSV4, kv_cache_dtype="bf16")
    c = case("dsv4_attn", [{"count": 1, "q": 1, "ctx": 100}], **args, compress_ratio=0).args.cost()
    assert c.cache_bytes == (3 + 1) * 32 * 2


def test_gdn_recurrent_state_conv_and_projections():
    batch = [{"count": 2, "q": 1, "ctx": 10}, {"count": 1, "q": 5, "ctx": 0}]
    c = case("gdn", batch, hidden=32, qk_heads=2, v_heads=4, head_dim=8, conv_kernel=4).args.cost()
    t, conv = 7, 2 * 16 + 32
    assert c.projection_flops == 2 * t * 32 * (conv + 32 + 4 + 4) + 2 * t * 32 * 32
    assert c.attention_flops == t * (2 * conv * 4 + 7 * 4 * 8 * 8)
    state = 4 * 8 * 8 * 4 + 3 * conv * 2                           # fp32 state + bf16 conv state
    assert c.state_bytes == 2 * 2 * state + 1 * state               # read only with a context
    assert c.cache_bytes == 0


def test_kda_low_rank_decay_and_bf16_state():
    c = case("kda", [{"count": 1, "q": 2, "ctx": 3}], hidden=32, heads=2, head_dim=8, conv_kernel=4,
             state_dtype="bf16").args.cost()
    p = 16
    assert c.projection_flops == 2 * 2 * (4 * 32 * p + 32 * 8 + 8 * p + 32 * 2 + p * 32)
    assert c.attention_flops == 2 * (2 * 3 * p * 4 + 7 * 2 * 64)
    assert c.state_bytes == 2 * (2 * 64 * 2 + 3 * 3 * p * 2)


def test_delta_rule_count_is_seven_d_squared_on_a_literal_step():
    d, macs, mults = 3, 0, 0
    s = [[0.1 * (i + j) for j in range(d)] for i in range(d)]
    k, v, q = [0.1] * d, [0.2] * d, [0.3] * d
    for i in range(d):                                  # decay
        for j in range(d):
            mults += 1
            s[i][j] *= 0.9
    sk = [0.0] * d
    for i in range(d):                                  # Sᵀk
        for j in range(d):
            macs += 1
            sk[j] += s[i][j] * k[i]
    for i in range(d):                                  # rank-1 update with (v - Sᵀk)
        for j in range(d):
            macs += 1
            s[i][j] += k[i] * (v[j] - sk[j])
    out = [0.0] * d
    for i in range(d):                                  # Sᵀq
        for j in range(d):
            macs += 1
            out[j] += s[i][j] * q[i]
    assert all(o != 0 for o in out)
    one_token = case("gdn", [{"count": 1, "q": 1, "ctx": 0}], hidden=4, qk_heads=1, v_heads=1, head_dim=d,
                     conv_kernel=1).args.cost()
    assert one_token.attention_flops - 2 * (3 * d) * 1 == 2 * macs + mults


# ---- capping, dtypes, ranges -----------------------------------------------------------------

def test_a_window_caps_each_token_and_the_cached_tokens_read():
    wide = case("gqa", [{"count": 1, "q": 3, "ctx": 5}], **GQA, window=100).args.cost()
    none = case("gqa", [{"count": 1, "q": 3, "ctx": 5}], **GQA).args.cost()
    assert wide == none
    narrow = case("gqa", [{"count": 1, "q": 3, "ctx": 5}], **GQA, window=3).args.cost()
    assert narrow.attention_flops == 4 * 4 * 16 * (3 + 3 + 3)
    assert narrow.cache_bytes == (2 + 3) * 2 * 32 * 2             # W-1 cached tokens read, 3 written


def test_fp8_cache_is_half_the_bf16_cache():
    bf16 = case("gqa", [{"count": 4, "q": 1, "ctx": 1000}], **GQA, kv_cache_dtype="bf16").args.cost()
    fp8 = case("gqa", [{"count": 4, "q": 1, "ctx": 1000}], **GQA, kv_cache_dtype="fp8").args.cost()
    auto = case("gqa", [{"count": 4, "q": 1, "ctx": 1000}], **GQA).args.cost()
    assert auto == bf16 and bf16.cache_bytes == 2 * fp8.cache_bytes == 4 * 1001 * 2 * 32 * 2
    assert bf16.flops == fp8.flops


def test_a_ctx_range_counts_at_its_mean():
    ranged = case("gqa", [{"count": 3, "q": 2, "ctx": {"dist": "uniform", "min": 100, "max": 300}}], **GQA)
    fixed = case("gqa", [{"count": 3, "q": 2, "ctx": 200}], **GQA)
    assert ranged.flops() == fixed.flops() and ranged.min_bytes() == fixed.min_bytes()
    half = case("mla", [{"count": 2, "q": 1, "ctx": {"dist": "uniform", "min": 0, "max": 3}}], **MLA).args.cost()
    assert half.cache_bytes == round(2 * (Fraction(3, 2) + 1) * 40)        # mean 1.5, exact


def test_closed_form_matches_the_token_by_token_sum():
    for ctx in (Fraction(0), Fraction(7), Fraction(15, 2), Fraction(100)):
        for q in (1, 5, 40):
            for cap in (None, 1, 8, 60):
                for ratio in (1, 4):
                    assert attended(ctx, q, cap, ratio) == keys(ctx, q, cap, ratio)


def test_quantized_projection_weights_cost_their_stored_bytes():
    fp8 = {"dtype": "e4m3", "scale": {"dtype": "fp32", "static": True, "group": [-1, -1]}}
    pair = {"a": {"dtype": "bf16"}, "b": fp8}
    plain = case("gqa", [{"count": 1, "q": 1, "ctx": 0}], **GQA).args.cost()
    quant = Case.model_validate({"type": "gqa", "args": {**GQA, "batch": {"groups": [{"count": 1, "q": 1, "ctx": 0}]},
                                                         "proj": {"q_proj": pair}}}).args.cost()
    assert plain.projection_bytes - quant.projection_bytes == 64 * 64 * 2 - (64 * 64 + 4)


def test_parallel_leaves_the_count_of_the_whole_module():
    one = case("gqa", [{"count": 2, "q": 1, "ctx": 64}], **GQA)
    split = Case.model_validate({"type": "gqa", "args": {**GQA, "batch": {"groups": [{"count": 2, "q": 1, "ctx": 64}]},
                                                         "parallel": {"tp": 2, "dcp": 2}}})
    assert split.flops() == one.flops() and split.min_bytes() == one.min_bytes()


# ---- the dominant part -----------------------------------------------------------------------

def test_dominant_part_is_the_longest_roofline_time():
    decode = case("gqa", [{"count": 64, "q": 1, "ctx": 32768}], **GQA).args.cost()
    assert decode.dominant(1000, 4000) == "cache_bytes"
    prefill = case("gqa", [{"count": 1, "q": 4096, "ctx": 0}], **GQA).args.cost()
    times = prefill.part_seconds(1000, 4000)
    assert prefill.dominant(1000, 4000) == max(times, key=lambda p: times[p]) == "attention_flops"
    state = case("kda", [{"count": 64, "q": 1, "ctx": 100}], hidden=32, heads=8, head_dim=128,
                 conv_kernel=4).args.cost()
    assert state.dominant(1000, 4000) == "state_bytes"
    with pytest.raises(ValueError, match="peaks must be positive"):
        decode.dominant(0, 4000)


def test_totals_are_the_sums_of_the_parts():
    c = AttentionCost(projection_flops=1, attention_flops=2, projection_bytes=3, cache_bytes=4, state_bytes=5)
    assert (c.flops, c.bytes) == (3, 12)


# ---- still planned, and the planner still orders --------------------------------------------

def test_every_upstream_attention_case_has_a_positive_count_and_a_named_refusal_on_one_device():
    for raw in json.loads((UPSTREAM / "attn_parallel.json").read_text()):
        c = Case.model_validate(raw)
        assert c.flops() > 0 and c.min_bytes() > 0, c.label()
        if c.type in ("gqa", "mla", "dsv4_attn"):
            assert c.implemented
            assert case_refusal(c) == (f"needs tp·dp = {c.world} GPUs of one host; this run has 1 (one process runs "
                                       "every case here; --rank-local times one rank's shard)")
        else:
            missing = c.args.missing()
            assert case_refusal(c) == f"op type {c.type} is not implemented yet" + (f": {missing}" if missing else "")
            assert c.type == "kda" and "vLLM 0.26 has no module" in missing, c.type  # what is missing, and where


def test_the_planner_orders_attention_cases_by_their_estimate():
    small = Case.model_validate(gemm(m=1, n=256, k=256))
    decode = case("gqa", [{"count": 64, "q": 1, "ctx": 32768}], **GQA)
    assert estimated_s(decode) == max(decode.flops() / 1000e12, decode.min_bytes() / 4000e9) > estimated_s(small)
    order = longest_first([(0, small), (1, decode)], lambda t: t[1])
    assert [i for i, _ in order] == [1, 0]


# ---- one rank's shard (--rank-local) -----------------------------------------------------

def test_a_gqa_shard_splits_its_heads_and_replicates_kv_heads_below_tp():
    two = case("gqa", [{"count": 2, "q": 1, "ctx": 64}], **GQA, parallel={"tp": 2}).args
    shard, rule = two.rank_shard()
    assert (shard.q_heads, shard.kv_heads, shard.parallel) == (2, 1, None)
    assert rule == "heads tensor-parallel over 2: q_heads 4 -> 2, kv_heads 2 -> 1"
    four = case("gqa", [{"count": 2, "q": 1, "ctx": 64}], **GQA, parallel={"tp": 4}).args
    shard, rule = four.rank_shard()
    assert (shard.q_heads, shard.kv_heads) == (1, 1) and "kv_heads 2 -> 1 (each KV head replicated on 2 ranks)" in rule
    assert shard.flops() < four.flops() and shard.batch == four.batch


def test_an_mla_shard_splits_heads_and_a_dcp_one_has_no_shard():
    tp = case("mla", [{"count": 2, "q": 1, "ctx": 64}], **MLA, parallel={"tp": 2}).args
    shard, rule = tp.rank_shard()
    assert (shard.heads, shard.kv_lora_rank, shard.q_lora_rank) == (1, 16, 32) and rule.endswith("heads 2 -> 1")
    dcp = case("mla", [{"count": 2, "q": 1, "ctx": 64}], **MLA, parallel={"tp": 2, "dcp": 2}).args
    with pytest.raises(ShardRefused, match="dcp=2: each rank attends 1/2 of every context"):
        dcp.rank_shard()
    odd = case("gqa", [{"count": 1, "q": 1, "ctx": 8}], **{**GQA, "q_heads": 6, "kv_heads": 3}, parallel={"tp": 2}).args
    with pytest.raises(ShardRefused, match="q_heads=6 does not split 2 ways|kv_heads=3 does not split 2 ways"):
        odd.rank_shard()


def test_a_gdn_shard_divides_its_qk_and_v_heads_and_refuses_a_split_that_does_not_divide():
    gdn = {"hidden": 64, "qk_heads": 4, "v_heads": 8, "head_dim": 16, "conv_kernel": 4}
    tp = case("gdn", [{"count": 2, "q": 1, "ctx": 64}], **gdn, parallel={"tp": 4}).args
    shard, rule = tp.rank_shard()
    assert (shard.qk_heads, shard.v_heads, shard.head_dim, shard.parallel) == (1, 2, 16, None)
    assert rule == "heads tensor-parallel over 4: qk_heads 4 -> 1, v_heads 8 -> 2"
    assert shard.cost_parts()["state_bytes"] * 4 == tp.cost_parts()["state_bytes"]
    odd = case("gdn", [{"count": 1, "q": 1, "ctx": 8}], **gdn, parallel={"tp": 8}).args
    with pytest.raises(ShardRefused, match="qk_heads=4 does not split 8 ways"):
        odd.rank_shard()


def test_an_mla_dsa_shard_divides_the_mla_heads_and_keeps_the_indexer_whole():
    tp = case("mla_dsa", [{"count": 2, "q": 1, "ctx": 1000}], **DSA, parallel={"tp": 2}).args
    shard, rule = tp.rank_shard()
    assert (shard.heads, shard.index_heads, shard.index_dim, shard.topk, shard.parallel) == (1, 2, 16, 32, None)
    assert rule == "heads tensor-parallel over 2: heads 2 -> 1"
    whole, one = tp.cost(), shard.cost()
    assert one.cache_bytes == whole.cache_bytes            # the latent and index-key caches are every rank's
    assert whole.attention_flops - one.attention_flops == 2 * 2 * 36 * 32   # one head's sparse attention less


def test_a_dsv4_shard_divides_heads_and_o_groups_and_keeps_the_compressor_and_indexer_whole():
    ratio4 = dict(DSV4, compress_ratio=4, indexer="own", topk=3, index_heads=2, index_dim=8, compress_rope_theta=1e4)
    tp = case("dsv4_attn", [{"count": 2, "q": 1, "ctx": 40}], **ratio4, parallel={"tp": 2}).args
    shard, rule = tp.rank_shard()
    assert (shard.heads, shard.o_groups, shard.o_lora_rank, shard.index_heads, shard.topk, shard.parallel) == (
        2, 1, 8, 2, 3, None)
    assert rule == "heads tensor-parallel over 2: heads 4 -> 2, o_groups 2 -> 1"
    whole, one = tp.cost(), shard.cost()
    assert (one.cache_bytes, one.state_bytes) == (whole.cache_bytes, whole.state_bytes)   # every rank's caches
    # wq_b (16 -> 4·32), wo_a (64 -> 2·8) and wo_b (2·8 -> 64) lose half their outputs / inputs; the rest is whole
    assert whole.projection_flops - one.projection_flops == 2 * 2 * (16 * 64 + 64 * 8 + 8 * 64)
    with pytest.raises(ShardRefused, match="o_groups=2 does not split 4 ways"):
        case("dsv4_attn", [{"count": 1, "q": 1, "ctx": 40}], **ratio4, parallel={"tp": 4}).args.rank_shard()


def test_a_reuse_layer_with_indexer_projections_is_refused_by_field():
    bf16 = {"a": {"dtype": "bf16"}, "b": {"dtype": "bf16"}}
    with pytest.raises(ValueError, match=r"proj.indexer.wq_b: an `indexer: reuse` layer runs no indexer"):
        case("mla_dsa", [{"count": 1, "q": 1, "ctx": 8}], **DSA, indexer="reuse", proj={"indexer.wq_b": bf16})
    assert case("mla_dsa", [{"count": 1, "q": 1, "ctx": 8}], **DSA, indexer="reuse", proj={"o_proj": bf16})


def test_layer_kinds_of_one_model_never_share_a_label():
    """What changes a module's work beyond its head sizes is in its label (and its family), so two layer
    kinds of one checkpoint (GLM-5.2's own and shared indexers, DeepSeek-V4's two index caches, a gated
    Qwen3.5 layer) are two lines on the Shape page."""
    decode = [{"count": 16, "q": 1, "ctx": 8192}]
    dsa = case("mla_dsa", decode, **DSA).args
    assert dsa.label() == "mla_dsa H=64 2h r16 16x(q1,ctx8192)"
    assert case("mla_dsa", decode, **DSA, indexer="reuse").args.label() == "mla_dsa H=64 2h r16 reuse 16x(q1,ctx8192)"
    ratio4 = dict(DSV4, compress_ratio=4, indexer="own", topk=3, index_heads=2, index_dim=8, compress_rope_theta=1e4)
    assert case("dsv4_attn", decode, **ratio4, index_cache_dtype="fp8").args.heads_label() == "4h×32 w4 c4"
    assert case("dsv4_attn", decode, **ratio4, index_cache_dtype="mxfp4").args.heads_label() == "4h×32 w4 c4 idx:mxfp4"
    shared = dict(ratio4, compress_ratio=128, indexer=None, topk=None, index_heads=None, index_dim=None, source=False)
    assert case("dsv4_attn", decode, **shared).args.heads_label() == "4h×32 w4 c128 src0"
    assert case("gqa", decode, **GQA, qk_norm=True, gate=True).args.heads_label() == "4q/2kv×16 qk-norm gated"
    assert case("gqa", decode, **GQA, window=128).args.family() == "gqa H=64 4q/2kv×16 w128 Mx(q1,ctx8192)"
    kda = dict(hidden=32, heads=2, head_dim=8, conv_kernel=4)
    assert case("kda", decode, **kda).args.heads_label() == "2h×8"
    assert case("kda", decode, **kda, state_dtype="bf16").args.heads_label() == "2h×8 state:bf16"


def test_attention_families_differ_in_the_batch_alone():
    """The Shape page plots a family against the batch: one line per module and (q, ctx), never two
    models or two contexts on one line."""
    decode16 = case("gqa", [{"count": 16, "q": 1, "ctx": 8192}], **GQA).args
    decode64 = case("gqa", [{"count": 64, "q": 1, "ctx": 8192}], **GQA).args
    longer = case("gqa", [{"count": 16, "q": 1, "ctx": 32768}], **GQA).args
    other_heads = case("gqa", [{"count": 16, "q": 1, "ctx": 8192}], **{**GQA, "kv_heads": 4}).args
    assert decode16.family() == decode64.family() == "gqa H=64 4q/2kv×16 Mx(q1,ctx8192)"
    assert (decode16.size(), decode64.size()) == (16, 64)
    assert len({decode16.family(), longer.family(), other_heads.family()}) == 3
    assert decode16.label() == "gqa H=64 4q/2kv×16 16x(q1,ctx8192)"
