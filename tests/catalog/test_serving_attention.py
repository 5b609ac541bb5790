"""DeepSeek-V4's attention in the catalog (catalog/serving_attention.py, dsv4_modules): one `dsv4_attn`
module per layer kind, equal field by field to upstream's own dsv4_attn cases but for the checkpoint's
wo_a (the catalog writes it, upstream leaves it out), counted per kind in a serving step, and NotDerived
naming the config field where the catalog lacks it; GLM-5.2's IndexShare (index_share_modules): one mla_dsa
module per indexer kind, each over its own layers."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from operatorx.catalog import generate
from operatorx.catalog.arch import read_arch
from operatorx.catalog.checkpoints import find_checkpoints, load_catalog
from operatorx.catalog.errors import CatalogError, MissingField, NotDerived
from operatorx.catalog.serving import Scenario, serving
from operatorx.catalog.serving_attention import DSV4_INDEX_CACHES, attention_modules, dsv4_modules
from operatorx.spec import Case

pytestmark = pytest.mark.filterwarnings("ignore::operatorx.catalog.errors.CatalogWarning")

UPSTREAM = Path(__file__).resolve().parents[1] / "spec" / "upstream" / "attn_parallel.json"
#: Upstream checkpoints the catalog holds but whose V4 attention it cannot derive, and the field it lacks
#: (deepseek-v4.1-flash.json leaves compress_ratios out: V4.1's CSA2 sharing was not read).
NOT_DERIVED = {"deepseek-ai/DeepSeek-V4.1-Flash": "compress_ratios"}
DECODE = {"groups": [{"count": 16, "q": 1, "ctx": 16384}]}


def _ckpt(model_id: str):
    (ckpt,) = find_checkpoints([model_id])
    return ckpt


def _roles(ckpt):
    return next(iter(ckpt.schemes.values()))


def _rearch(ckpt, **facts):
    """The checkpoint's arch with config facts replaced (None drops the key)."""
    config = {k: v for k, v in {**ckpt.arch.config, **facts}.items() if v is not None}
    return read_arch(config, ckpt.arch.origin, dict(ckpt.arch.implementation))


def _args(kind: str, args: dict) -> dict:
    """The args as validated, every default filled in (what two cases compare by)."""
    return Case.model_validate({"type": kind, "args": args}).args.model_dump(mode="json")


def _without(proj: dict, name: str) -> dict:
    return {k: v for k, v in proj.items() if k != name}


def _upstream_by_setting() -> dict[tuple[str, str, int, int], list[dict]]:
    """Upstream's dsv4_attn cases by (checkpoint, batch, tp, dp), their args validated."""
    out: dict[tuple[str, str, int, int], list[dict]] = defaultdict(list)
    for raw in json.loads(UPSTREAM.read_text()):
        if raw["type"] != "dsv4_attn":
            continue
        (source,) = raw["sources"]
        split = raw["args"].get("parallel", {})
        key = (source.rsplit("/", 1)[0], json.dumps(raw["args"]["batch"]), split.get("tp", 1), split.get("dp", 1))
        out[key].append(_args(raw["type"], raw["args"]))
    return out


def test_every_upstream_dsv4_case_of_a_catalog_checkpoint_is_the_catalogs_field_by_field():
    held = {c.id for c in load_catalog()}
    compared = 0
    for (model, batch, tp, dp), want in _upstream_by_setting().items():
        if model not in held:
            continue
        ckpt = _ckpt(model)
        if model in NOT_DERIVED:
            with pytest.raises(NotDerived, match=f"'{NOT_DERIVED[model]}' is missing"):
                attention_modules(ckpt.arch, _roles(ckpt), json.loads(batch), tp, dp, DSV4_INDEX_CACHES)
            continue
        made = attention_modules(ckpt.arch, _roles(ckpt), json.loads(batch), tp, dp, DSV4_INDEX_CACHES)
        # the one known difference: the catalog writes wo_a's operands, upstream's cases leave it out
        assert all("wo_a" in m.args["proj"] for m in made)
        got = [_args(m.kind, {**m.args, "proj": _without(m.args["proj"], "wo_a")}) for m in made]
        assert [m.kind for m in made] == ["dsv4_attn"] * len(made)
        # each upstream case is one of the catalog's, and the catalog writes no kind upstream lacks
        for case in want:
            assert case in got, (model, batch, tp, dp, case["compress_ratio"], case.get("index_cache_dtype"))
        assert len(got) == len(want), (model, batch, tp, dp)
        compared += len(want)
    # DeepSeek-V4-Pro: (ratio 4 at fp8 and mxfp4 index keys, ratio 128) x 2 batches x (tp 4, 8, dp 4, 8)
    assert compared == 3 * 2 * 4


def test_deepseek_v4_pro_kinds_hand_checked():
    # deepseek-v4-pro.json: hidden 7168, 128 heads x 512, rope 64, q_lora 1536, window 128, 16 groups of
    # o_lora 1024; indexer 64 heads x 128, topk 1024; rope_theta 1e4, compress 1.6e5, yarn 16 over 65536
    ckpt = _ckpt("deepseek-ai/DeepSeek-V4-Pro")
    made = dsv4_modules(ckpt.arch, _roles(ckpt), DECODE, 8, 1)
    assert [(m.role, m.layers) for m in made] == [("attn:c4", 30), ("attn:c128", 31)]
    c4, c128 = (m.args for m in made)
    assert (c4["heads"], c4["head_dim"], c4["rope_dim"], c4["q_lora_rank"], c4["window"]) == (128, 512, 64, 1536, 128)
    assert (c4["o_groups"], c4["o_lora_rank"], c4["kv_cache_dtype"]) == (16, 1024, "fp8")
    assert (c4["indexer"], c4["topk"], c4["index_heads"], c4["index_dim"], c4["index_cache_dtype"]) == \
        ("own", 1024, 64, 128, "fp8")
    assert (c4["rope_theta"], c4["compress_rope_theta"]) == (10000.0, 160000.0)
    assert c4["rope_scaling"] == {"type": "yarn", "factor": 16.0, "original_max": 65536, "beta_fast": 32.0,
                                  "beta_slow": 1.0}
    assert sorted(c4["proj"]) == ["indexer.wq_b", "wkv", "wo_a", "wo_b", "wq_a", "wq_b"]
    assert sorted(c128["proj"]) == ["wkv", "wo_a", "wo_b", "wq_a", "wq_b"] and "indexer" not in c128
    block = {"dtype": "e4m3", "scale": {"dtype": "ue8m0", "static": True, "group": [128, 128]}}
    assert all(pair["b"] == block for pair in c4["proj"].values())
    assert c4["parallel"] == {"tp": 8}
    assert made[0].metadata == {} and made[1].metadata == {}


def test_layer_kind_counts_add_up_to_the_decoder_layers():
    # compress_ratios up to num_hidden_layers (the entries after them are the MTP layers')
    expected = {"deepseek-ai/DeepSeek-V4-Pro": (61, {"attn:c4": 30, "attn:c128": 31}),
                "deepseek-ai/DeepSeek-V4-Flash": (43, {"attn:c0": 2, "attn:c4": 21, "attn:c128": 20})}
    for model, (layers, kinds) in expected.items():
        ckpt = _ckpt(model)
        made = dsv4_modules(ckpt.arch, _roles(ckpt), DECODE, 1, 1)
        assert {m.role: m.layers for m in made} == kinds
        assert sum(m.layers or 0 for m in made) == layers == ckpt.arch.int("num_hidden_layers", "test")


def test_flash_window_only_layers_carry_no_compression_and_say_rope_scaling_is_left_out():
    ckpt = _ckpt("deepseek-ai/DeepSeek-V4-Flash")
    (c0,) = [m for m in dsv4_modules(ckpt.arch, _roles(ckpt), DECODE, 4, 1) if m.role == "attn:c0"]
    assert c0.args["compress_ratio"] == 0 and c0.args["rope_theta"] == 10000.0
    assert not {"compress_rope_theta", "rope_scaling", "indexer"} & set(c0.args)
    assert c0.metadata["rope_scaling_not_in_case"].startswith("yarn factor 16 (dsv4_attn holds rope_scaling only")


def test_a_missing_fact_is_named():
    ckpt = _ckpt("deepseek-ai/DeepSeek-V4-Pro")
    roles = _roles(ckpt)
    with pytest.raises(NotDerived, match="config field 'compress_ratios' is missing"):
        dsv4_modules(_rearch(ckpt, compress_ratios=None), roles, DECODE, 8, 1)
    with pytest.raises(MissingField, match="'compress_rope_theta' is missing"):
        dsv4_modules(_rearch(ckpt, compress_rope_theta=None), roles, DECODE, 8, 1)
    with pytest.raises(MissingField, match="'index_topk' is missing"):
        dsv4_modules(_rearch(ckpt, index_topk=None), roles, DECODE, 8, 1)
    # V4.1's ratios 1 and 2 share caches across layers in ways the config fields read here do not say
    ratios = [2] + list(ckpt.arch.config["compress_ratios"][1:])
    with pytest.raises(NotDerived, match="at compress ratio 2 are not derived"):
        dsv4_modules(_rearch(ckpt, compress_ratios=ratios), roles, DECODE, 8, 1)
    v41 = _ckpt("deepseek-ai/DeepSeek-V4.1-Flash")
    with pytest.raises(NotDerived, match="'compress_ratios' is missing"):
        dsv4_modules(v41.arch, _roles(v41), DECODE, 8, 1)


def test_serving_step_holds_each_kind_over_its_layers():
    # testlist serving --model deepseek-ai/DeepSeek-V4-Pro --isl 960 --osl 128 --conc 16 (tp 1)
    cases = serving("deepseek-ai/DeepSeek-V4-Pro", Scenario(isl=960, osl=128, conc=16))
    for step in ("decode", "prefill"):
        dsv4 = [c for c in cases if c.type == "dsv4_attn" and c.step == step]
        by_role = {c.sources[0].rsplit("/", 1)[1]: c for c in dsv4}
        assert {r: c.count for r, c in by_role.items()} == {"attn:c4": 30, "attn:c128": 31}
        assert sum(c.count or 0 for c in dsv4) == 61
        assert by_role["attn:c4"].args.index_cache_dtype == "fp8"        # vLLM's default index-key cache alone
    decode = next(c for c in cases if c.type == "dsv4_attn" and c.step == "decode")
    assert [(g.count, g.q, g.ctx) for g in decode.args.batch.groups] == [(16, 1, 960 + 128 // 2)]
    prefill = next(c for c in cases if c.type == "dsv4_attn" and c.step == "prefill")
    # 8192 // 960 = 8 whole prompts, then the first 8192 - 8 * 960 = 512 tokens of a ninth
    assert [(g.count, g.q, g.ctx) for g in prefill.args.batch.groups] == [(8, 960, 0), (1, 512, 0)]
    assert decode.args.parallel is None


def test_generate_with_attention_writes_every_kind_at_every_batch():
    cases = [c for c in generate(["deepseek-v4-pro"], ms=[1], attention=True) if c.type == "dsv4_attn"]
    by_role: dict[str, int] = defaultdict(int)
    for c in cases:
        by_role[c.sources[0].rsplit("/", 1)[1]] += 1
    # 4 request counts x 4 contexts + 3 prefill chunks at TP 8; ratio 4 once per index-key cache
    batches = 4 * 4 + 3
    assert dict(by_role) == {"attn:c4": 2 * batches, "attn:c128": batches}
    assert {c.args.parallel.tp for c in cases} == {8}


GLM52 = "zai-org/GLM-5.2-FP8"


def test_glm52_index_share_is_one_mla_dsa_module_per_indexer_kind():
    ckpt = _ckpt(GLM52)
    own, shared = attention_modules(ckpt.arch, _roles(ckpt), DECODE, 8, 1)
    assert (own.role, own.layers, shared.role, shared.layers) == ("self_attn", 21, "self_attn:shared", 57)
    assert own.args["indexer"] == "own" and shared.args["indexer"] == "reuse"
    assert own.args["rope_theta"] == 8000000 and own.args["parallel"] == {"tp": 8}
    # a shared layer runs no indexer: its projections are the MLA ones alone, block FP8 as the checkpoint's
    assert set(own.args["proj"]) - set(shared.args["proj"]) == {"indexer.wq_b", "indexer.wk"}
    assert {pair["b"]["dtype"] for pair in own.args["proj"].values()} == {"e4m3"}
    assert _without(_without(own.args, "indexer"), "proj") == _without(_without(shared.args, "indexer"), "proj")
    for m in (own, shared):
        Case.model_validate({"type": m.kind, "args": m.args})


def test_glm52_serving_step_counts_each_indexer_kind_over_its_layers():
    cases = serving(GLM52, Scenario(isl=960, osl=128, conc=16, tp=8))
    decode = {c.sources[0].rsplit("/", 1)[1]: c.count for c in cases if c.type == "mla_dsa" and c.step == "decode"}
    assert decode == {"self_attn": 21, "self_attn:shared": 57}


@pytest.mark.parametrize(("types", "words"), [
    (["full"] * 77, "for each of the 78 layers"),
    (["full"] * 77 + ["skip"], "for each of the 78 layers"),
    (["shared"] + ["full"] * 77, "layer 0 is 'shared'"),
])
def test_a_malformed_indexer_types_is_named(types, words):
    ckpt = _ckpt(GLM52)
    with pytest.raises(CatalogError, match="indexer_types") as err:
        attention_modules(_rearch(ckpt, indexer_types=types), _roles(ckpt), DECODE, 8, 1)
    assert words in str(err.value)
