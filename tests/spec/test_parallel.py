"""`parallel` in upstream's meaning: the whole layer over tp·dp ranks, axes per family, one key per split."""

from __future__ import annotations

import pytest

from operatorx.spec import Case, TestlistError, load_testlist
from tests.conftest import gemm, moe

GQA = {"type": "gqa", "args": {"hidden": 1024, "q_heads": 16, "kv_heads": 4, "head_dim": 64, "rope_dim": 64,
                               "rope_theta": 10000.0, "batch": {"groups": [{"count": 2, "q": 1, "ctx": 128}]}}}


def _with(case: dict, parallel: object) -> dict:
    return {**case, "args": {**case["args"], "parallel": parallel}}


@pytest.mark.parametrize("case,parallel,field,words", [
    (gemm(), {"dp": 4}, "args.parallel", "dp=4: a gemm op splits only along tp"),
    (gemm(), {"ep": 8}, "args.parallel", "ep=8: expert parallelism spans every rank or none"),
    (gemm(), {"dcp": 2, "tp": 2}, "args.parallel", "dcp=2: a gemm op splits only along tp"),
    (moe(), {"ep": 8}, "args.parallel", "ep is 1 or tp·dp = 1"),
    (moe(), {"tp": 8, "ep": 4}, "args.parallel", "ep is 1 or tp·dp = 8"),
    (moe(), {"tp": 2, "dcp": 2}, "args.parallel", "dcp=2: a moe op splits only along tp, dp, ep"),
    (GQA, {"tp": 8, "dcp": 3}, "args.parallel", "dcp=3 does not divide tp=8"),
    (GQA, {"tp": 2, "ep": 2}, "args.parallel", "ep=2: a attention op splits only along tp, dp, dcp"),
    (gemm(), {"tp": 0}, "args.parallel.tp", "greater than 0"),
    (gemm(), {"tp": "8"}, "args.parallel.tp", "valid integer"),
    (gemm(), {"tp": True}, "args.parallel.tp", "valid integer"),
    (gemm(), {"pp": 2}, "args.parallel.pp", "Extra inputs"),
    (gemm(), [8], "args.parallel", "valid dictionary"),
])
def test_an_invalid_split_is_refused_with_file_case_and_field(write_testlist, case, parallel, field, words):
    path = write_testlist([gemm(), _with(case, parallel)])
    with pytest.raises(TestlistError) as info:
        load_testlist(path)
    line = next(p for p in info.value.problems if f"{path}: case 1: {field}" in p)
    assert words in line, info.value.problems


@pytest.mark.parametrize("spellings", [
    [None, {}, {"tp": 1}, {"tp": 1, "dp": 1, "ep": 1, "dcp": 1}],
    [{"tp": 8}, {"tp": 8, "dp": 1}, {"dcp": 1, "tp": 8, "ep": 1}],
])
def test_every_spelling_of_one_split_is_one_case_key_and_seed(spellings):
    cases = [Case.model_validate(gemm() if p is None else _with(gemm(), p)) for p in spellings]
    assert len({c.key() for c in cases}) == 1 and len({c.seed() for c in cases}) == 1
    assert len({c.to_json()["args"].get("parallel") is None for c in cases}) == 1


def test_different_splits_are_different_cases_with_their_own_seed():
    tp8, tp4, single = (Case.model_validate(_with(gemm(), p)) for p in ({"tp": 8}, {"tp": 4}, {}))
    assert len({tp8.key(), tp4.key(), single.key()}) == 3 and tp8.seed() != single.seed()
    assert '"parallel":{"tp":8}' in tp8.key() and "parallel" not in single.key()


def test_world_size_is_tp_times_dp_and_the_label_names_the_split():
    case = Case.model_validate(_with(moe(), {"dp": 4, "tp": 2, "ep": 8}))
    assert case.world == 8 and case.parallel is not None and case.parallel.label() == "tp2·dp4·ep8"
    assert case.label().endswith(" tp2·dp4·ep8")
    assert Case.model_validate(_with(GQA, {"tp": 8, "dcp": 8})).world == 8
    assert Case.model_validate(gemm()).world == 1
