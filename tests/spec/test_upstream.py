"""Upstream-style testlists load unchanged; the older flat formats upgrade and then validate."""

from __future__ import annotations

import json
import warnings

import pytest

from operatorx.spec import Case, TestlistError, TestlistWarning, load_testlist, merge_cases, parse_cases
from operatorx.spec.upgrade import UpgradeError, upgrade_cases
from tests.conftest import fp8_block, gemm, moe

GLM = ["zai-org/GLM-5-FP8", "zai-org/GLM-5.1-FP8", "zai-org/GLM-5.2-FP8"]


def test_one_role_in_name_applies_to_every_source():
    case = Case.model_validate({**moe(), "sources": GLM, "name": ["mlp"]})
    assert case.sources == [f"{s}/mlp" for s in GLM]


def test_one_role_per_source_still_pairs_up():
    case = Case.model_validate({**moe(), "sources": GLM[:2], "name": ["mlp", "experts"]})
    assert case.sources == ["zai-org/GLM-5-FP8/mlp", "zai-org/GLM-5.1-FP8/experts"]


def test_recipes_are_metadata_kept_and_never_part_of_identity(write_testlist):
    recipes = ["sglang-glm5-fp8-tp8", "vllm-glm5-fp8-ep8"]
    path = write_testlist([{**moe(), "sources": GLM, "name": ["mlp"], "recipes": recipes}, moe()])
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # recipes is a known key: no warning
        first, second = load_testlist(path)
    assert first.recipes == recipes and second.recipes == []
    assert first == second and first.key() == second.key() and hash(first) == hash(second)
    merged = merge_cases([second, first])
    assert len(merged) == 1 and merged[0].recipes == recipes and len(merged[0].sources) == 3
    assert first.to_json()["recipes"] == recipes and "recipes" not in second.to_json()


def test_unknown_top_level_keys_warn_and_are_kept(write_testlist):
    path = write_testlist([{**gemm(), "owner": "perf-team", "[/red]": 1}])
    seen: list[str] = []
    (case,) = load_testlist(path, on_warning=seen.append)
    assert case.metadata == {"owner": "perf-team", "[/red]": 1}
    assert len(seen) == 2 and f"{path}: case 0: owner: not a case field; kept as metadata" in seen[0]
    assert case == Case.model_validate(gemm())
    with pytest.warns(TestlistWarning) as record:
        load_testlist(path)
    assert ["owner" in str(w.message) for w in record] == [True, False]


def test_unknown_keys_inside_args_stay_errors(write_testlist):
    bad = gemm()
    bad["args"]["mm"] = 4
    with pytest.raises(TestlistError, match=r"case 0: args.mm: Extra inputs"):
        load_testlist(write_testlist([bad]))


def test_an_upstream_moe_small_style_file_loads_unchanged(write_testlist):
    cases = [
        {**moe(tokens=1), "sources": GLM, "name": ["mlp"], "recipes": ["glm5-fp8-serving"]},
        {**fp8_block(m=1), "sources": ["deepseek-ai/DeepSeek-R1-0528/q_a_proj"]},
        {**moe(tokens=8), "sources": GLM[:1], "name": ["mlp"]},
    ]
    loaded = load_testlist(write_testlist(cases))
    assert [len(c.sources) for c in loaded] == [3, 1, 1]


# --- older flat formats --------------------------------------------------------------------------

OLD_MOE = {"type": "moe_gemm", "name": "deepseek-r1-decode", "args": {
    "num_tokens": 8, "hidden": 7168, "intermediate": 2048, "num_experts": 256, "top_k": 8,
    "dtype_act": "fp8", "dtype_weight": "fp8", "expert_parallel_size": 8, "routed_tensor_parallel_size": 1,
    "shared_tensor_parallel_size": 1, "n_shared_experts": 1, "expert_distribution": "uniform"}}
OLD_GEMM = {"type": "gemm", "name": "skinny", "args": {"m": 16, "n": 4096, "k": 4096, "dtype_a": "bf16",
                                                        "dtype_b": "bf16", "dtype_out": "bf16"}}


@pytest.mark.parametrize("old", [OLD_MOE, OLD_GEMM], ids=["moe_gemm", "gemm"])
def test_loading_an_old_file_says_to_upgrade_it(write_testlist, old):
    path = write_testlist([old, old])
    with pytest.raises(TestlistError) as info:
        load_testlist(path)
    assert len(info.value.problems) == 1
    assert f"operatorx testlist upgrade {path} -o NEW.json" in info.value.problems[0]
    assert "case 0: the older flat format" in info.value.problems[0]


def test_old_moe_becomes_the_whole_layer_with_upstreams_ep_split():
    (new,), notes = upgrade_cases([OLD_MOE], "f")
    case = Case.model_validate(new)
    a = case.args
    assert a.tokens == 8 and a.hidden == 7168 and a.experts.num == 256 and a.experts.top_k == 8
    assert a.experts.inter == 2048 and a.shared is not None and a.shared.count == 1 and a.shared.inter == 2048
    assert a.experts.w1.scale.group == [128, 128] and a.experts.w1.scale.static
    assert a.experts.a1.scale.group == [1, 128] and not a.experts.a1.scale.static
    assert a.parallel is not None and a.parallel.split() == {"tp": 8, "ep": 8} and case.world == 8
    assert a.routing.distribution == "natural" and case.sources == ["deepseek-r1-decode"]
    assert any("softmax top-k" in n for n in notes)


def test_old_moe_tensor_parallel_keeps_the_whole_intermediate_and_zipf_maps():
    old = json.loads(json.dumps(OLD_MOE))
    old["args"].update(dtype_act="bf16", dtype_weight="mxfp4", routed_tensor_parallel_size=4,
                       shared_tensor_parallel_size=4, expert_parallel_size=1, expert_distribution="zipf")
    (new,), _ = upgrade_cases([old], "f")
    a = Case.model_validate(new).args
    assert a.experts.num == 256 and a.experts.inter == 2048 and a.shared.inter == 2048
    assert a.experts.a1.dtype == "bf16" and a.experts.w1.dtype == "e2m1" and a.experts.w1.scale.dtype == "ue8m0"
    assert a.routing.name == "zipf1" and a.parallel.split() == {"tp": 4}


@pytest.mark.parametrize("dt,expect", [("bf16", "bf16"), ("fp8", "e4m3/fp32:tensor"),
                                       ("nvfp4", "e2m1/e4m3:1x16"), ("mxfp4", "e2m1/ue8m0:1x32")])
def test_old_gemm_dtype_strings_become_descriptors(dt, expect):
    old = json.loads(json.dumps(OLD_GEMM))
    old["args"].update(dtype_a=dt, dtype_b=dt)
    (new,), _ = upgrade_cases([old], "f")
    case = Case.model_validate(new)
    assert case.args.b.scheme_name().startswith(expect) and case.sources == ["skinny"]


def test_mixed_old_and_new_cases_upgrade_together():
    out, notes = upgrade_cases([OLD_GEMM, gemm()], "f")
    assert len(parse_cases(out, "f")) == 2 and notes[0].startswith("1 gemm and 0 moe cases converted, 1 already")


@pytest.mark.parametrize("patch,field,words", [
    ({"dtype_weight": "int4"}, "args.dtype_weight", "no descriptor equivalent"),
    ({"expert_distribution": "model_native"}, "args.expert_distribution", "has no equivalent"),
    ({"expert_parallel_size": 3}, "args.num_experts", "does not divide by expert_parallel_size=3"),
    ({"world_size": 8}, "args.world_size", "write `parallel`"),
    ({"routed_tensor_parallel_size": 2}, "args.routed_tensor_parallel_size", "no TP inside expert-parallel"),
    ({"expert_parallel_size": 1, "routed_tensor_parallel_size": 4, "shared_tensor_parallel_size": 2},
     "args.shared_tensor_parallel_size", "split like the layer (4 ways)"),
    ({"input_seed": 43}, "args.input_seed", "has no equivalent in the descriptor format"),
    ({"num_tokens": 0}, "args.num_tokens", "not an integer >= 1"),
    ({"hidden": None}, "args.hidden", "missing"),
])
def test_what_has_no_equivalent_is_named(patch, field, words):
    old = json.loads(json.dumps(OLD_MOE))
    old["args"].update(patch)
    if patch.get("hidden", 1) is None:
        del old["args"]["hidden"]
    with pytest.raises(UpgradeError) as info:
        upgrade_cases([OLD_GEMM, old], "f")
    assert any(p.startswith(f"f: case 1: {field}: ") and words in p for p in info.value.problems), info.value.problems


def test_a_converted_case_the_format_refuses_names_the_new_field():
    old = json.loads(json.dumps(OLD_MOE))
    old["args"]["hidden"] = 7000          # block scales of 128 do not divide it
    with pytest.raises(UpgradeError, match=r"f \(upgraded\): case 0: args: experts.a1.scale.group"):
        upgrade_cases([old], "f")


def test_to_json_reads_back_exactly_with_recipes_and_metadata(write_testlist):
    path = write_testlist([{**gemm(), "owner": "perf", "recipes": ["r1"], "sources": ["o/m/q"]}])
    (case,) = load_testlist(path, on_warning=lambda _m: None)
    again = Case.model_validate(case.to_json())          # what a sweep ships to its worker processes
    assert again == case and again.metadata == {"owner": "perf"} and again.recipes == ["r1"]
    assert again.sources == ["o/m/q"]


def test_world_size_one_is_dropped():
    old = json.loads(json.dumps(OLD_MOE))
    old["args"]["world_size"] = 1
    (new,), _ = upgrade_cases([old], "f")
    assert "world_size" not in json.dumps(new)
