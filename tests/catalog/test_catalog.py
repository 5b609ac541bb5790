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


def test_unconfirmed_roles_warn_with_the_reason():
    # gpt-oss-120b experts at TP 8: inter 2880/8 = 360 does not tile the MXFP4 group of 32.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CatalogWarning)
        cases = generate(["openai/gpt-oss-120b"], [8], [1], moe_tokens=[1])
    messages = [str(w.message) for w in caught]
    assert any("mlp.experts: case not produced" in m and "inter=360" in m for m in messages)
    assert any(c.sources[0].endswith("/lm_head") for c in cases)


def test_deepseek_v4_produces_every_role_group():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CatalogWarning)
        generate(["deepseek-ai/DeepSeek-V4-Flash", "deepseek-ai/DeepSeek-V4-Pro"], [8], [1], moe_tokens=[1])
    assert not [str(w.message) for w in caught]


@pytest.mark.parametrize("name", ["gemm", "gemm_perf", "moe_small"])
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
    dists = {(c.sources[0].rsplit("/", 1)[0], c.args.routing.name) for c in moe}
    for ckpt in ("deepseek-ai/DeepSeek-R1-0528", "Qwen/Qwen3-235B-A22B-Thinking-2507"):
        assert {d for s, d in dists if s == ckpt} == {"natural", "balanced", "single_hot", "zipf1.2"}
