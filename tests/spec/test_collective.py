"""`collective` args: validation naming the field, NCCL-tests' size convention, and the work counts."""

from __future__ import annotations

import pytest

from operatorx.spec import Case, TestlistError, parse_cases
from operatorx.spec.collective import bus_factor


def coll(kind: str = "all_reduce", tp: int = 1, **over) -> dict:
    args = {"kind": kind, "elements": 1024, "dtype": "bf16", **over}
    if tp > 1:
        args["parallel"] = {"tp": tp}
    return {"type": "collective", "args": args, "sources": []}


def _problem(case: dict) -> str:
    with pytest.raises(TestlistError) as err:
        parse_cases([case], "f.json")
    assert len(err.value.problems) == 1
    return err.value.problems[0]


@pytest.mark.parametrize("case, line", [
    (coll("allreduce"), "f.json: case 0: args.kind: Input should be 'all_reduce', 'all_gather', 'reduce_scatter' "
                        "or 'all_to_all'"),
    (coll(dtype="e2m1"), "f.json: case 0: args.dtype: Input should be 'bf16', 'fp16', 'fp32', 'e4m3', 'e5m2' or "
                         "'int8'"),
    (coll(size=3), "f.json: case 0: args.size: Extra inputs are not permitted"),
    (coll("all_gather", tp=4, elements=10), "f.json: case 0: args: elements=10: all_gather over tp=4 ranks cuts its "
                                            "buffer into 4 equal shards; 10 does not divide by 4"),
    (coll(parallel={"dp": 2}), "f.json: case 0: args.parallel: dp=2: a collective op splits only along tp (one "
                               "group of W ranks, written tp=W)"),
    ({"type": "collective", "args": {"kind": "all_reduce", "bytes": 9, "dtype": "bf16"}},
     "f.json: case 0: args: bytes=9: not a whole number of bf16 elements (2 bytes each)"),
    ({"type": "collective", "args": {"kind": "all_reduce", "bytes": 8, "elements": 4, "dtype": "bf16"}},
     "f.json: case 0: args: bytes and elements: give one of them (bytes is read as elements of dtype)"),
])
def test_a_bad_field_is_one_line_naming_it(case, line):
    assert _problem(case) == line


def test_bytes_is_read_as_elements_one_case_one_key():
    by_bytes = Case.model_validate({"type": "collective", "args": {"kind": "all_gather", "bytes": 4096,
                                                                   "dtype": "fp32", "parallel": {"tp": 2}}})
    by_elements = Case.model_validate(coll("all_gather", tp=2, dtype="fp32"))
    assert by_bytes == by_elements and by_bytes.args.elements == 1024
    assert by_bytes.to_json()["args"] == {"kind": "all_gather", "elements": 1024, "dtype": "fp32",
                                          "parallel": {"tp": 2}}
    assert by_bytes.label() == "all_gather 1024xfp32 tp2" and by_bytes.args.family() == "all_gather Nxfp32 tp2"
    assert by_bytes.scheme() == "fp32" and by_bytes.args.size() == 1024 and by_bytes.world == 2


def test_one_rank_is_a_valid_case_with_no_work():
    c = Case.model_validate(coll("reduce_scatter", elements=7, parallel={"tp": 1}))
    assert c.parallel is None and c.world == 1
    assert c.flops() == 0 and c.min_bytes() == 0
    bus = c.args.bus_traffic()
    assert bus is not None and bus.size_bytes == 14 and bus.bus_factor == 0.0


@pytest.mark.parametrize("kind, tp, flops, min_bytes, factor", [
    # elements 1024 of bf16: size S = 2048 bytes
    ("all_reduce", 8, 7 * 1024, 4 * 7 * 2048, 2 * 7 / 8),      # (W-1)·n adds; each rank 2·(7/8)·S each way
    ("reduce_scatter", 8, 7 * 1024, 2 * 7 * 2048, 7 / 8),      # each rank sums its n/W: (W-1)·n/W adds a rank
    ("all_gather", 4, 0, 2 * 3 * 2048, 3 / 4),                 # each rank receives 3/4·S and sends as much
    ("all_to_all", 2, 0, 2 * 1 * 2048, 1 / 2),
])
def test_flops_bytes_and_bus_factor_by_hand(kind, tp, flops, min_bytes, factor):
    c = Case.model_validate(coll(kind, tp=tp))
    assert c.flops() == flops and c.min_bytes() == min_bytes
    # min_bytes is every rank's send + receive together: W · 2 · factor · S
    assert c.min_bytes() == pytest.approx(tp * 2 * factor * 2048)
    bus = c.args.bus_traffic()
    assert bus is not None and bus.size_bytes == 2048 and bus.bus_factor == pytest.approx(factor)
    assert bus_factor(kind, tp) == pytest.approx(factor)


def test_other_op_types_have_no_bus_traffic():
    from tests.conftest import gemm

    assert Case.model_validate(gemm()).args.bus_traffic() is None


def test_no_rank_local_shard():
    from operatorx.spec.shard import ShardRefused

    with pytest.raises(ShardRefused, match="no work is left to time"):
        Case.model_validate(coll(tp=2)).args.rank_shard([])
