"""The catalog data: enough checkpoints, each with sources; shipped testlists are fresh."""

from __future__ import annotations

import warnings

import pytest

from operatorx.catalog import CatalogWarning, build_shipped, generate, load_catalog
from operatorx.spec import load_testlist, shipped_testlists


def test_catalog_size_and_provenance():
    catalog = load_catalog()
    assert len(catalog) >= 29
    for ckpt in catalog:
        assert ckpt.facts_from, ckpt.id
        assert set(ckpt.tps) <= {1, 2, 4, 8}


def test_unconfirmed_roles_warn_with_the_reason():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CatalogWarning)
        cases = generate(["deepseek-ai/DeepSeek-V4-Flash"], [8], [1])
    messages = [str(w.message) for w in caught]
    assert any("DeepSeek-V4 attention roles" in m for m in messages)
    assert any(c.sources[0].endswith("/lm_head") for c in cases)


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
