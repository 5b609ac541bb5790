"""A split case's rank-local shard is the computation the catalog's per-rank case names: the same key."""

from __future__ import annotations

import warnings

import pytest

from operatorx.catalog import CatalogWarning, generate
from operatorx.catalog.checkpoints import load_catalog
from operatorx.catalog.gemm_split import CATALOG_SHAPES
from operatorx.spec import Case
from operatorx.spec.shard import ShardRefused


def _pairs(model: str, tp: int, tokens: tuple[int, ...] = (8,)) -> list[tuple[Case, Case]]:
    """(whole layer with its split, the per-rank case) of each role of `model` at `tp`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CatalogWarning)
        whole = generate([model], [tp], [8], moe_tokens=tokens, parallel=True)
        rank = generate([model], [tp], [8], moe_tokens=tokens)

    def role(source: str) -> str:
        return source.split(":padded")[0]
    by_source = {(c.type, role(s)): c for c in rank for s in c.sources}
    return [(c, by_source[(c.type, role(s))]) for c in whole for s in c.sources]


def _shard(case: Case) -> Case:
    args, _rule = case.args.rank_shard(case.sources, CATALOG_SHAPES)
    return Case(type=case.type, args=args)


def test_kimi_k3_down_proj_tp8_shard_is_k_4224():
    whole = Case.model_validate({"type": "gemm", "sources": ["moonshotai/Kimi-K3/mlp.down_proj"], "args": {
        "m": 8, "n": 7168, "k": 33792, "a": {"dtype": "bf16"}, "b": {"dtype": "bf16"}, "parallel": {"tp": 8}}})
    args, rule = whole.args.rank_shard(whole.sources, CATALOG_SHAPES)
    assert (args.m, args.n, args.k) == (8, 7168, 4224) and args.parallel is None
    assert rule.startswith("row-parallel by role mlp.down_proj: k 33792 -> 4224")
    (per_rank,) = [c for c, _ in [(r, 0) for _, r in _pairs("moonshotai/Kimi-K3", 8)]
                   if c.sources[0].endswith("/mlp.down_proj") and c.type == "gemm"]
    assert per_rank.args.k == 4224 and _shard(whole).key() == per_rank.key()


def test_deepseek_v4_pro_wo_b_tp8_is_row_parallel_over_o_groups_times_o_lora():
    pairs = [(w, r) for w, r in _pairs("deepseek-ai/DeepSeek-V4-Pro", 8) if w.sources[0].endswith("/attn.wo_b")]
    assert pairs
    whole, rank = pairs[0]
    assert whole.args.k == 16384 and rank.args.k == 2048 and whole.args.n == rank.args.n == 7168
    assert _shard(whole).key() == rank.key()


def test_minimax_m3_moe_at_tp4_shards_the_experts_intermediate_to_768():
    (whole, rank), = [(w, r) for w, r in _pairs("MiniMaxAI/MiniMax-M3-MXFP8", 4) if w.type == "moe"]
    assert whole.args.experts.inter == 3072 and whole.parallel is not None and whole.parallel.split() == {"tp": 4}
    shard = _shard(whole)
    assert shard.args.experts.inter == 768 and shard.key() == rank.key()


@pytest.mark.parametrize("ckpt", [c.id for c in load_catalog() if max(c.tps) > 1])
def test_every_layer_of_every_checkpoint_the_shard_is_the_per_rank_case(ckpt):
    """For each deployed TP: generate --parallel's whole layer, cut by --rank-local, is the per-rank case
    the single-device lists hold (gpt-oss's MXFP4 experts excepted: the per-rank case runs vLLM's padded
    intermediate size, the shard the unpadded one vLLM pads itself)."""
    checked = 0
    for tp in (t for t in next(c for c in load_catalog() if c.id == ckpt).tps if t > 1):
        for whole, rank in _pairs(ckpt, tp, tokens=(8,)):
            if any(":padded-from-" in s for s in rank.sources):
                continue
            assert _shard(whole).key() == rank.key(), (tp, whole.sources[0])
            checked += 1
    assert checked > 0


def test_an_ep8_moe_rank_holds_one_eighth_of_the_experts():
    case = Case.model_validate({"type": "moe", "sources": [], "args": {
        "tokens": 8, "hidden": 256, "experts": {"num": 256, "top_k": 8, "inter": 128, "w1": {"dtype": "bf16"},
                                                "w2": {"dtype": "bf16"}},
        "router": {"gate": {"dtype": "bf16"}, "scoring": "softmax", "select": {"kind": "topk"}},
        "activation": {"kind": "silu"}, "parallel": {"dp": 8, "ep": 8}}})
    args, rule = case.args.rank_shard(case.sources, CATALOG_SHAPES)
    assert args.experts.local == 32 and args.experts.num == 256 and args.tokens == 64      # all 8 dp batches
    assert "rank 0 holds experts 0-31 of 256" in rule


def test_an_ep_moe_with_zero_experts_has_no_shard():
    case = Case.model_validate({"type": "moe", "sources": [], "args": {
        "tokens": 8, "hidden": 256, "experts": {"num": 16, "top_k": 2, "inter": 128, "zero": 2,
                                                "w1": {"dtype": "bf16"}, "w2": {"dtype": "bf16"}},
        "router": {"gate": {"dtype": "bf16"}, "scoring": "softmax", "select": {"kind": "topk"}},
        "activation": {"kind": "silu"}, "parallel": {"tp": 2, "ep": 2}}})
    with pytest.raises(ShardRefused, match="zero experts"):
        case.args.rank_shard(case.sources, CATALOG_SHAPES)
