"""The catalog data: enough checkpoints, each with sources; shipped testlists are fresh."""

from __future__ import annotations

import warnings

import pytest

from operatorx.catalog import CatalogWarning, build_shipped, generate, load_catalog
from operatorx.spec import load_testlist, shipped_testlists


def test_catalog_size_and_provenance():
    catalog = load_catalog()
    assert len(catalog) >= 34
    for ckpt in catalog:
        assert ckpt.facts_from, ckpt.id
        assert set(ckpt.tps) <= {1, 2, 4, 8}


def test_gpt_oss_moe_at_tp4_and_tp8_runs_vllms_padded_intermediate_size():
    """2880/4 = 720 and 2880/8 = 360 are not multiples of the OAI-Triton MXFP4 alignment (64): vLLM 0.26
    pads them to 768 and 384 (fused_moe/oracle/mxfp4.py); the case runs the padded size and says so."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CatalogWarning)
        cases = generate(["openai/gpt-oss-120b"], [1, 2, 4, 8], [1], moe_tokens=[1])
    assert not [str(w.message) for w in caught]
    moe = {c.metadata["deployment"]["tp"][0]: c for c in cases if c.type == "moe"}
    assert {tp: c.args.experts.inter for tp, c in moe.items()} == {1: 2880, 2: 1472, 4: 768, 8: 384}
    assert moe[1].sources == ["openai/gpt-oss-120b/mlp.experts"]
    assert moe[4].sources == ["openai/gpt-oss-120b/mlp.experts:padded-from-720"]
    assert moe[8].sources == ["openai/gpt-oss-120b/mlp.experts:padded-from-360"]


def test_the_catalog_generates_without_gaps():
    """Every role of every checkpoint at every deployed TP is produced: no warning is left."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CatalogWarning)
        generate(ms=[1], moe_tokens=[1])
    assert not [str(w.message) for w in caught]


def test_deepseek_v4_produces_every_role_group():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CatalogWarning)
        generate(["deepseek-ai/DeepSeek-V4-Flash", "deepseek-ai/DeepSeek-V4-Pro"], [8], [1], moe_tokens=[1])
    assert not [str(w.message) for w in caught]


@pytest.mark.parametrize("name", ["gemm", "gemm_perf", "gemm_fp8", "moe_small", "attn_small"])
def test_shipped_testlist_is_fresh(name):
    built = build_shipped()[name]
    shipped = load_testlist(shipped_testlists()[name])
    assert [c.to_json() for c in shipped] == [c.to_json() for c in built], (
        f"{name}.json is stale: run `python -m operatorx.catalog`")


def test_shipped_sizes():
    built = build_shipped()
    assert len(built["gemm"]) >= 2000
    assert 10 <= len(built["gemm_perf"]) <= 24
    assert any((c.args.m, c.args.n, c.args.k) == (8192, 8192, 8192) for c in built["gemm_perf"])
    assert all(c.args.a.dtype == "bf16" for c in built["gemm_perf"])
    moe = built["moe_small"]
    assert len(moe) < 200  # swept through vLLM on the H200
    dists = {(c.sources[0].rsplit("/", 1)[0], c.args.routing.name) for c in moe}
    for ckpt in ("deepseek-ai/DeepSeek-R1-0528", "Qwen/Qwen3-235B-A22B-Thinking-2507", "Qwen/Qwen3.5-397B-A17B-FP8"):
        assert {d for s, d in dists if s == ckpt} == {"natural", "balanced", "single_hot", "zipf1.2"}
