"""Rank-local shards by rule: GEMMs by their role, MoE experts tensor-parallel over tp·dp."""

from __future__ import annotations

import pytest

from operatorx.spec import Case
from operatorx.spec.shard import ShardRefused, split_of_role
from tests.conftest import gemm, moe


def _split(case: dict, parallel: dict, sources: list[str]) -> Case:
    return Case.model_validate({**case, "args": {**case["args"], "parallel": parallel}, "sources": sources})


@pytest.mark.parametrize("role,split", [
    ("mlp.down_proj", "row"), ("self_attn.o_proj", "row"), ("attn.wo_b", "row"), ("ffn.shared_experts.w2", "row"),
    ("block_sparse_moe.shared_experts.down_proj", "row"), ("linear_attn.out_proj", "row"),
    ("self_attn.qkv_proj", "column"), ("mlp.gate_up_proj", "column"), ("attn.wq_b", "column"),
    ("self_attn.kv_b_proj", "column"), ("ffn.shared_experts.w1", "column"), ("lm_head", "vocab"),
    ("mlp.gate", "replicated"), ("self_attn.fused_qkv_a_proj", "replicated"), ("attn.indexer.wq_b", "replicated"),
    ("attn.compressor.fused_wkv_wgate:c4", "replicated"), ("hc_attn_fn", "replicated"), ("attn.wo_a", "replicated"),
    ("mystery_proj", None),
])
def test_the_role_decides_the_split(role, split):
    assert split_of_role(role) == split


def test_column_row_vocab_and_replicated_shards():
    col = _split(gemm(m=4, n=1024, k=512), {"tp": 4}, ["o/m/mlp.gate_up_proj"])
    row = _split(gemm(m=4, n=1024, k=512), {"tp": 4}, ["o/m/mlp.down_proj"])
    vocab = _split(gemm(m=4, n=1000, k=512), {"tp": 8}, ["o/m/lm_head"])
    rep = _split(gemm(m=4, n=1024, k=512), {"tp": 4}, ["o/m/mlp.gate"])
    shapes = [c.args.rank_shard(c.sources)[0] for c in (col, row, vocab, rep)]
    assert [(a.n, a.k) for a in shapes] == [(256, 512), (1024, 128), (128, 512), (1024, 512)]
    assert all(a.parallel is None and a.m == 4 for a in shapes)


@pytest.mark.parametrize("sources,words", [
    ([], "no sources"),
    (["o/m/mystery_proj"], "no split rule"),
    (["o/m/mlp.down_proj", "o/n/mlp.gate_up_proj"], "the sources disagree"),
])
def test_a_gemm_whose_role_does_not_say_how_it_splits_is_refused(sources, words):
    case = _split(gemm(m=4, n=1024, k=512), {"tp": 4}, sources)
    with pytest.raises(ShardRefused, match=words):
        case.args.rank_shard(case.sources)


def test_a_split_that_does_not_divide_or_breaks_a_block_scale_is_refused():
    case = _split(gemm(m=4, n=1024, k=300), {"tp": 8}, ["o/m/o_proj"])
    with pytest.raises(ShardRefused, match="k=300 does not split 8 ways"):
        case.args.rank_shard(case.sources)
    block = {"type": "gemm", "args": {"m": 4, "n": 256, "k": 1024, "out": "bf16",
             "a": {"dtype": "e4m3", "scale": {"dtype": "fp32", "static": False, "group": [1, 128]}},
             "b": {"dtype": "e4m3", "scale": {"dtype": "fp32", "static": True, "group": [128, 128]}}}}
    case = _split(block, {"tp": 16}, ["o/m/o_proj"])
    with pytest.raises(ShardRefused, match="not a valid GEMM"):
        case.args.rank_shard(case.sources)


def test_a_tp_moe_splits_experts_and_shared_experts_and_keeps_the_tokens():
    shared = {"count": 1, "inter": 256, "w1": {"dtype": "bf16"}, "w2": {"dtype": "bf16"}}
    case = _split(moe(tokens=8, shared=shared), {"tp": 4}, [])
    args, rule = case.args.rank_shard(case.sources)
    assert (args.tokens, args.experts.num, args.experts.inter, args.shared.inter) == (8, 8, 32, 64)
    assert "experts.inter 128 -> 32" in rule and args.parallel is None


def test_a_dp_moe_brings_each_groups_own_batch_and_its_experts_see_all_of_them():
    case = _split(moe(tokens=8), {"dp": 4, "tp": 2}, [])
    args, rule = case.args.rank_shard(case.sources)
    assert args.tokens == 32 and args.experts.inter == 16 and args.experts.num == 8
    assert "tokens 8 -> 32 (the 4 dp batches its experts see; the router runs over all of them here" in rule


@pytest.mark.parametrize("parallel,local,tokens", [({"dp": 4, "ep": 4}, 2, 32), ({"tp": 2, "ep": 2}, 4, 8)])
def test_an_ep_moe_holds_its_share_of_whole_experts(parallel, local, tokens):
    case = _split(moe(tokens=8), parallel, [])
    args, rule = case.args.rank_shard(case.sources)
    assert args.experts.local == local and args.experts.num == 8 and args.experts.inter == 128
    assert args.tokens == tokens and args.parallel is None
    assert f"rank 0 holds experts 0-{local - 1} of 8 (experts.local {local})" in rule


def test_the_flops_of_an_ep_share_are_its_share_of_the_pairs():
    whole = Case.model_validate(moe(tokens=8))
    share = Case.model_validate({**moe(tokens=8), "args": {**moe(tokens=8)["args"], "experts": {
        **moe()["args"]["experts"], "local": 2}}})
    router = 2 * 8 * 256 * 8
    assert share.flops() - router == (whole.flops() - router) // 4


def test_a_dp_moe_with_shared_experts_has_no_single_device_shard():
    shared = {"count": 1, "inter": 256, "w1": {"dtype": "bf16"}, "w2": {"dtype": "bf16"}}
    case = _split(moe(shared=shared), {"dp": 2}, [])
    with pytest.raises(ShardRefused, match="shared experts see its own batch"):
        case.args.rank_shard(case.sources)
