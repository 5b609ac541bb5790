"""Bad input: every refusal names the file, the case index and the field."""

from __future__ import annotations

import copy
import json

import pytest

from operatorx.spec import TestlistError, dump_testlist, load_testlist, resolve_testlist, shipped_testlists
from tests.conftest import fp8_block, gemm, moe


def _set(d: dict, path: str, value) -> dict:
    d = copy.deepcopy(d)
    node = d
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if k.isdigit() else node[k]
    last = keys[-1]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return d


_DELETE = object()

# (name, case, expected field path in the message, expected words)
BAD_CASES = [
    ("unknown key", _set(gemm(), "args.mm", 4), "args.mm", "Extra inputs"),
    ("unknown key in a scale", _set(fp8_block(), "args.a.scale.grop", [1, 1]), "args.a.scale.grop", "Extra inputs"),
    ("string for int", _set(gemm(), "args.m", "4"), "args.m", "valid integer"),
    ("float for int", _set(gemm(), "args.k", 256.0), "args.k", "valid integer"),
    ("zero size", _set(gemm(), "args.n", 0), "args.n", "greater than 0"),
    ("negative size", _set(gemm(), "args.m", -1), "args.m", "greater than 0"),
    ("unknown element dtype", _set(gemm(), "args.a.dtype", "bf17"), "args.a.dtype", "'bf16'"),
    ("unknown scale dtype", _set(fp8_block(), "args.b.scale.dtype", "fp64"), "args.b.scale.dtype", "'ue8m0'"),
    ("group of wrong length", _set(fp8_block(), "args.a.scale.group", [1, 128, 1]), "args.a.scale.group",
     "at most 2"),
    ("group not dividing K", _set(fp8_block(), "args.a.scale.group", [1, 100]), "args", "does not divide K=256"),
    ("group with zero", _set(fp8_block(), "args.b.scale.group", [0, 128]), "args.b.scale", "not 0"),
    ("quantized operand without scale", _set(fp8_block(), "args.a.scale", _DELETE), "args.a", "needs a scale"),
    ("unknown op type", _set(gemm(), "type", "conv"), "type", "is not an op type OperatorX or upstream defines"),
    ("missing args field", _set(gemm(), "args.k", _DELETE), "args.k", "Field required"),
    ("top_k > experts", _set(moe(), "args.experts.top_k", 9), "args", "exceeds the 8 experts"),
    ("groups not dividing experts",
     _set(moe(), "args.router.select", {"kind": "grouped_topk", "groups": 3, "topk_groups": 1}), "args",
     "does not divide experts.num=8"),
    ("unknown scoring", _set(moe(), "args.router.scoring", "relu"), "args.router.scoring", "'softmax'"),
    ("unknown selection", _set(moe(), "args.router.select", {"kind": "random"}), "args.router.select",
     "does not match"),
    ("unknown distribution", _set(moe(), "args.routing.distribution", "uniform"), "args.routing.distribution",
     "natural"),
    ("unknown activation", _set(moe(), "args.activation.kind", "relu2"), "args.activation.kind", "'silu'"),
    ("bool for int", _set(moe(), "args.tokens", True), "args.tokens", "valid integer"),
    ("sources not a list", _set(gemm(), "sources", "a/b/c"), "sources", "valid list"),
]


@pytest.mark.parametrize("name,case,field,words", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_case_is_refused_precisely(write_testlist, name, case, field, words):
    path = write_testlist([gemm(), case])
    with pytest.raises(TestlistError) as info:
        load_testlist(path)
    text = str(info.value)
    assert f"{path}: case 1: {field}" in text, text
    assert words in text, text


def test_null_case(write_testlist):
    path = write_testlist([gemm(), None])
    with pytest.raises(TestlistError, match=r"case 1: a case is a JSON object, got null"):
        load_testlist(path)


def test_not_json(write_testlist):
    path = write_testlist("[{\"type\": ")
    with pytest.raises(TestlistError, match=r"not JSON: line 1"):
        load_testlist(path)


def test_not_an_array(write_testlist):
    path = write_testlist({"type": "gemm"})
    with pytest.raises(TestlistError, match="a testlist is a JSON array of cases, got dict"):
        load_testlist(path)


def test_missing_file(tmp_path):
    with pytest.raises(TestlistError, match="cannot read"):
        load_testlist(tmp_path / "nope.json")


def test_every_problem_is_reported_not_just_the_first(write_testlist):
    path = write_testlist([_set(gemm(), "args.m", 0), _set(gemm(), "args.n", "x"), None])
    with pytest.raises(TestlistError) as info:
        load_testlist(path)
    assert [p.split(": ")[1] for p in info.value.problems] == ["case 0", "case 1", "case 2"]


def test_shipped_testlists_load_and_resolve_by_name():
    names = shipped_testlists()
    assert {"gemm_perf", "gemm_fp8", "gemm", "moe_small"} <= set(names)
    for name in names:
        assert load_testlist(resolve_testlist(name))


def test_unknown_name_lists_the_shipped_ones():
    with pytest.raises(TestlistError, match="shipped: .*gemm_perf"):
        resolve_testlist("no_such_list")


def test_upstream_style_file_loads_unchanged(write_testlist):
    """The upstream DeepSeek-V4 rewrite emits cases without sources, with ue8m0 block scales."""
    upstream = [{"type": "gemm", "args": {
        "m": 64, "n": 1024, "k": 7168,
        "a": {"dtype": "e4m3", "scale": {"dtype": "ue8m0", "static": False, "group": [1, 128]}},
        "b": {"dtype": "e4m3", "scale": {"dtype": "ue8m0", "static": True, "group": [128, 128]}},
        "out": "bf16"}},
        {"type": "gemm", "args": {"m": 64, "n": 512, "k": 7168, "a": {"dtype": "bf16"}, "b": {"dtype": "bf16"},
                                  "out": "bf16"}}]
    assert len(load_testlist(write_testlist(upstream))) == 2


def test_dump_then_load_round_trips(tmp_path):
    cases = load_testlist(resolve_testlist("gemm_fp8"))
    out = tmp_path / "copy.json"
    dump_testlist(cases, out)
    assert load_testlist(out) == cases
    assert json.loads(out.read_text())[0]["sources"] == cases[0].sources


def test_not_utf8(write_testlist, tmp_path):
    path = tmp_path / "latin1.json"
    path.write_bytes(b'[{"type": "gemm", "sources": ["caf\xe9"]}]')
    with pytest.raises(TestlistError, match="not UTF-8 text"):
        load_testlist(path)
