"""Strict JSON: what Python's json takes and JSON does not is one line naming file, case and field."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from operatorx.spec import Case, TestlistError, load_testlist
from operatorx.spec.strict_json import MAX_DEPTH, StrictJSONError, loads_strict
from tests.conftest import gemm, moe


def _text_with(case_index: int, replacement: str, marker: str = '"__X__"') -> str:
    cases = [gemm(), moe(), moe()]
    cases[case_index]["args"]["router"] = {"gate": {"dtype": "bf16"}, "scoring": "softmax",
                                           "select": {"kind": "topk"}, "scale": "__X__"}
    return json.dumps(cases).replace(marker, replacement)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999", "-1e400"])
def test_non_finite_numbers_name_case_and_field(write_testlist, literal):
    path = write_testlist(_text_with(2, literal))
    with pytest.raises(TestlistError) as info:
        load_testlist(path)
    assert info.value.problems == [info.value.problems[0]]
    line = info.value.problems[0]
    assert line.startswith(f"{path}: case 2: args.router.scale: ") and "finite" in line, line


def test_duplicate_keys_are_refused_not_last_one_wins(write_testlist):
    path = write_testlist('[{"type": "moe", "type": "gemm", "args": {"m": 1, "n": 1, "k": 1, "m": 2}}]')
    with pytest.raises(TestlistError) as info:
        load_testlist(path)
    text = str(info.value)
    assert f"{path}: case 0: type: key given twice" in text
    assert f"{path}: case 0: args.m: key given twice" in text


def test_deep_nesting_is_one_line_not_a_recursion_error(write_testlist):
    path = write_testlist("[" * 100_000 + "]" * 100_000)
    with pytest.raises(TestlistError) as info:
        load_testlist(path)
    assert len(info.value.problems) == 1
    assert f"nested deeper than {MAX_DEPTH} levels" in info.value.problems[0]
    assert info.value.problems[0].startswith(f"{path}: case 0: ")


def test_deep_nesting_names_the_case_it_is_in(write_testlist):
    path = write_testlist(json.dumps([gemm(), gemm()])[:-1] + ", " + "[" * 50 + "]" * 50 + "]")
    with pytest.raises(TestlistError, match=r"case 2: nested deeper"):
        load_testlist(path)


def test_a_5000_digit_integer_is_refused_with_its_field(write_testlist):
    text = json.dumps([gemm()]).replace('"m": 4', '"m": ' + "7" * 5000)
    path = write_testlist(text)
    with pytest.raises(TestlistError) as info:
        load_testlist(path)
    assert info.value.problems[0].startswith(f"{path}: case 0: args.m: an integer of 5000 digits")


def test_a_very_long_float_literal_is_refused(write_testlist):
    text = json.dumps([moe()]).replace('"seed": 0', '"seed": 0.' + "1" * 200)
    with pytest.raises(TestlistError, match=r"case 0: args.routing.seed: a number of 202 characters"):
        load_testlist(write_testlist(text))


def test_strings_that_look_like_brackets_do_not_count_as_nesting():
    text = json.dumps([{"note": "[" * 1000 + "{" * 1000, "x": "\\\"["}])
    assert loads_strict(text, "f")[0]["note"].startswith("[[[")


def test_a_non_array_document_reports_paths_without_a_case():
    with pytest.raises(StrictJSONError, match=r"^f: a.b: NaN"):
        loads_strict('{"a": {"b": NaN}}', "f")


def test_clean_json_decodes_to_plain_dicts():
    data = loads_strict('[{"a": 1, "b": [1.5, -2]}]', "f")
    assert data == [{"a": 1, "b": [1.5, -2]}] and type(data[0]) is dict


@pytest.mark.parametrize("field,value", [
    ("router.scale", float("nan")), ("activation.limit", float("-inf")), ("activation.alpha", float("inf"))])
def test_models_refuse_nan_and_inf_in_float_fields(field, value):
    d = moe()
    d["args"]["router"]["scale"] = 1.0
    part, key = field.split(".")
    d["args"][part][key] = value
    with pytest.raises(ValidationError, match="finite number"):
        Case.model_validate(d)


def test_zipf_s_infinity_is_refused():
    d = moe(routing={"distribution": {"kind": "zipf", "s": float("inf")}, "seed": 0})
    with pytest.raises(ValidationError, match="finite number"):
        Case.model_validate(d)


def test_a_thousand_bad_cases_show_twenty_lines_and_a_count(write_testlist):
    path = write_testlist([gemm(m=0)] * 1000)
    with pytest.raises(TestlistError) as info:
        load_testlist(path)
    assert len(info.value.problems) == 21 and info.value.problems[-1] == "... and 980 more"
    assert len(info.value.all_problems) == 1000
