"""Values the stores cannot hold or no checkpoint means are refused in the testlist, field named."""

from __future__ import annotations

import pytest

from operatorx.spec import Case, TestlistError, load_testlist
from operatorx.spec.base import MAX_INT64
from tests.conftest import gemm, moe

GQA = {"type": "gqa", "sources": [], "args": {
    "hidden": 4096, "batch": {"groups": [{"count": 1, "q": 1, "ctx": 128}]},
    "q_heads": 32, "kv_heads": 8, "head_dim": 128, "rope_dim": 128, "rope_theta": 10000.0}}


def _with(case: dict, path: str, value: object) -> dict:
    import copy

    out = copy.deepcopy(case)
    node = out
    *parents, last = path.split(".")
    for part in parents:
        node = node[part]
    node[last] = value
    return out


TOO_LARGE = [
    ("gemm m", gemm(), "args.m"),
    ("gemm k", gemm(), "args.k"),
    ("moe tokens", moe(), "args.tokens"),
    ("moe experts.inter", moe(), "args.experts.inter"),
    ("moe routing seed", moe(), "args.routing.seed"),
    ("gqa hidden", GQA, "args.hidden"),
    ("gqa head_dim", GQA, "args.head_dim"),
    ("parallel tp", gemm(parallel={"tp": 2}), "args.parallel.tp"),
]


@pytest.mark.parametrize("name,case,field", TOO_LARGE, ids=[t[0] for t in TOO_LARGE])
def test_a_size_above_2_63_is_refused_with_its_field(write_testlist, name, case, field):
    path = write_testlist([case, _with(case, field, 2**63)])
    with pytest.raises(TestlistError) as info:
        load_testlist(path)
    (line,) = info.value.problems
    assert line.startswith(f"{path}: case 1: {field}: 9223372036854775808 is above 2^63 - 1"), line
    assert "results databases" in line


def test_the_largest_size_both_stores_hold_is_accepted(write_testlist):
    (case,) = load_testlist(write_testlist([gemm(m=MAX_INT64)]))
    assert case.args.m == 2**63 - 1 and case.flops() == 2 * MAX_INT64 * 256 * 256


def test_a_negative_group_below_minus_one_and_a_huge_group_are_refused(write_testlist):
    scale = {"dtype": "fp32", "static": True, "group": [1, 2**63]}
    bad = gemm(a={"dtype": "e4m3", "scale": scale})
    with pytest.raises(TestlistError, match=r"case 0: args.a.scale.group\[1\]: 9223372036854775808 is above"):
        load_testlist(write_testlist([bad]))


INVISIBLE = ["\u200b", "\u200b\u200c\u200d", "\u2060", "\ufeff", " \u200b\t\u00a0", "\u200e\u202e"]


@pytest.mark.parametrize("source", INVISIBLE, ids=[repr(s) for s in INVISIBLE])
def test_a_source_of_only_invisible_characters_is_refused(write_testlist, source):
    path = write_testlist([{**gemm(), "sources": ["org/model/q_proj", source]}])
    with pytest.raises(TestlistError) as info:
        load_testlist(path)
    (line,) = info.value.problems
    assert line.startswith(f"{path}: case 0: sources: sources[1] "), line
    assert "invisible" in line or "control character" in line or "empty" in line


def test_a_source_with_a_control_character_is_refused_and_a_visible_one_with_zero_width_loads(write_testlist):
    with pytest.raises(TestlistError, match=r"case 0: sources: sources\[0\] holds the control character U\+001B"):
        load_testlist(write_testlist([{**gemm(), "sources": ["org/\u001b[31mred/q_proj"]}]))
    with pytest.raises(TestlistError, match=r"case 0: recipes: recipes\[0\] holds the control character U\+0000"):
        load_testlist(write_testlist([{**gemm(), "recipes": ["a\u0000b"]}]))
    (case,) = load_testlist(write_testlist([{**gemm(), "sources": ["org/mo\u200bdel/q_proj"]}]))
    assert case.sources == ["org/mo\u200bdel/q_proj"]


def test_a_lone_surrogate_in_a_document_source_is_refused():
    """A testlist cannot carry one (strict JSON refuses it); a result document read back can."""
    with pytest.raises(ValueError, match=r"sources\[0\] holds a lone surrogate"):
        Case.model_validate({**gemm(), "sources": ["org/\udcffmodel/q_proj"]})


_ROUTER = moe()["args"]["router"]
_ACT = moe()["args"]["activation"]
MEANINGLESS = [
    ("router.scale 0", moe(router={**_ROUTER, "scale": 0.0}), "args.router.scale"),
    ("router.scale -1", moe(router={**_ROUTER, "scale": -1.0}), "args.router.scale"),
    ("activation.limit 0", moe(activation={**_ACT, "limit": 0.0}), "args.activation.limit"),
    ("activation.limit -1", moe(activation={**_ACT, "limit": -1}), "args.activation.limit"),
    ("activation.alpha 0", moe(activation={"kind": "swigluoai", "alpha": 0.0}), "args.activation.alpha"),
    ("activation.alpha -1.702", moe(activation={"kind": "swigluoai", "alpha": -1.702}), "args.activation.alpha"),
]


@pytest.mark.parametrize("name,case,field", MEANINGLESS, ids=[m[0] for m in MEANINGLESS])
def test_values_no_checkpoint_means_are_refused_with_the_field(write_testlist, name, case, field):
    path = write_testlist([moe(), case])
    with pytest.raises(TestlistError) as info:
        load_testlist(path)
    (line,) = info.value.problems
    assert line == f"{path}: case 1: {field}: Input should be greater than 0", line


def test_positive_scale_limit_and_alpha_still_load(write_testlist):
    ok = moe(router={**_ROUTER, "scale": 2.5}, activation={"kind": "swigluoai", "alpha": 1.702, "limit": 7.0})
    (case,) = load_testlist(write_testlist([ok]))
    assert case.args.router.scale == 2.5 and case.args.activation.limit == 7.0


def test_validate_prints_one_line_naming_file_case_and_field(write_testlist):
    from typer.testing import CliRunner

    from operatorx.cli import app

    path = write_testlist([gemm(m=2**64), {**gemm(), "sources": ["\u200b"]}])
    r = CliRunner().invoke(app, ["testlist", "validate", str(path)])
    assert r.exit_code == 1 and "Traceback" not in r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 2, r.output
    assert "case 0: args.m: 18446744073709551616 is above 2^63 - 1" in lines[0]
    assert "case 1: sources: sources[0] holds only invisible characters" in lines[1]
