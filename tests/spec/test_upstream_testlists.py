"""The upstream OperatorX testlists (copies in tests/spec/upstream/, from SemiAnalysisAI/InferenceX
operatorx/testlists/) load unchanged: every op type upstream defines, every spelling."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from operatorx.spec import Case, TestlistError, load_testlist
from operatorx.spec.upgrade import upgrade_cases
from tests.conftest import moe

UPSTREAM = Path(__file__).parent / "upstream"
COUNTS = {
    "gemm_parallel": {"gemm": 50},
    "moe_parallel": {"moe": 46},
    "smoke_parallel": {"gemm": 3, "moe": 9, "dsv4_attn": 5, "mla": 1},
    "attn_parallel": {"dsv4_attn": 72, "gqa": 6, "mla": 4, "kda": 4},
    "moe_layer_small": {"moe": 28},
    "moe_small": {"moe": 68},
    "gemm_perf": {"gemm": 11},
}


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_every_upstream_testlist_loads_with_every_case(name):
    path = UPSTREAM / f"{name}.json"
    cases = load_testlist(path)
    assert len(cases) == len(json.loads(path.read_text()))
    assert dict(Counter(c.type for c in cases)) == COUNTS[name]


def test_attention_cases_load_as_planned_cases_of_their_family():
    cases = load_testlist(UPSTREAM / "attn_parallel.json")
    assert {c.family for c in cases} == {"attention"}
    assert {c.type for c in cases if c.implemented} == {"gqa", "mla", "dsv4_attn"}
    assert all(c.world > 1 for c in cases)
    gemms = load_testlist(UPSTREAM / "gemm_parallel.json")
    assert all(c.implemented and c.family == "gemm" for c in gemms)


def test_moe_layer_and_the_quant_spelling_are_the_same_case_as_todays_spelling():
    (layer,) = json.loads((UPSTREAM / "moe_layer_small.json").read_text())[:1]
    ex = layer["args"]["experts"]
    q = ex["quant"]
    today = json.loads(json.dumps(layer))
    today["type"] = "moe"
    today["args"]["experts"] = {**{k: v for k, v in ex.items() if k != "quant"},
                                "a1": q["x"], "w1": q["w13"], "w2": q["w2"], "a2": q["a2"]}
    sq = layer["args"]["shared"]["quant"]
    today["args"]["shared"] = {**{k: v for k, v in layer["args"]["shared"].items() if k != "quant"},
                               "a1": sq["x"], "w1": sq["w13"], "w2": sq["w2"]}
    newer = {**layer, "type": "moe"}              # upstream's newer `moe` with `quant`
    a, b, c = (Case.model_validate(x) for x in (layer, today, newer))
    assert a.type == "moe" and a.key() == b.key() == c.key() and a.seed() == b.seed()
    assert a.args.experts.w1.dtype == "e4m3" and a.args.shared is not None and a.args.shared.a1.scale is not None


def test_upgrade_writes_moe_layer_in_todays_spelling():
    data = json.loads((UPSTREAM / "moe_layer_small.json").read_text())
    out, notes = upgrade_cases(data, "f")
    assert {c["type"] for c in out} == {"moe"} and not any("quant" in json.dumps(c) for c in out)
    assert any("28 cases in upstream's moe_layer" in n for n in notes)
    assert [Case.model_validate(c).key() for c in out] == [Case.model_validate(c).key() for c in data]


@pytest.mark.parametrize("experts,field,words", [
    ({"quant": {"x": {"dtype": "bf16"}, "w9": {"dtype": "bf16"}}}, "args.experts.quant.w9", "not a slot"),
    ({"quant": [1]}, "args.experts.quant", "an object of operand descriptors"),
    ({"quant": {"w13": {"dtype": "bf16"}}, "w1": {"dtype": "bf16"}}, "args.experts.quant.w13", "given twice"),
])
def test_a_bad_quant_spelling_names_its_field(write_testlist, experts, field, words):
    bad = moe()
    bad["type"] = "moe_layer"
    bad["args"]["experts"] = {"num": 8, "top_k": 2, "inter": 128, **experts}
    with pytest.raises(TestlistError) as info:
        load_testlist(write_testlist([bad]))
    assert any(field in p and words in p for p in info.value.problems), info.value.problems


def test_a_malformed_attention_case_refuses_the_file_with_its_field(write_testlist):
    data = json.loads((UPSTREAM / "attn_parallel.json").read_text())
    gqa = next(i for i, c in enumerate(data) if c["type"] == "gqa")
    data[gqa]["args"]["kv_heads"] = 5
    mla = next(i for i, c in enumerate(data) if c["type"] == "mla")
    data[mla]["args"]["batch"]["groups"][0]["q"] = 0
    with pytest.raises(TestlistError) as info:
        load_testlist(write_testlist(data))
    problems = sorted(info.value.all_problems, key=lambda p: int(p.split(": case ")[1].split(":")[0]))
    assert len(problems) == 2, problems
    first, second = sorted([(gqa, "args: ", "kv_heads=5 does not divide q_heads"),
                            (mla, "args.batch.groups[0].q: ", "greater than 0")])
    for line, (index, field, words) in zip(problems, (first, second), strict=True):
        assert f"case {index}: {field}" in line and words in line, line


def test_an_op_type_neither_version_defines_is_an_error(write_testlist):
    with pytest.raises(TestlistError, match=r"case 0: type: 'conv2d' is not an op type"):
        load_testlist(write_testlist([{"type": "conv2d", "args": {}}]))
