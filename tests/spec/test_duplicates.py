"""A case given more than once is one case: first-seen order, its first copy's index, every copy's sources."""

from __future__ import annotations

import gc
import time

from typer.testing import CliRunner

from operatorx.cli import app
from operatorx.spec import Case, merge_cases
from operatorx.spec.testlist import merge_indexed, read_testlist
from tests.conftest import gemm, moe


def test_copies_merge_into_the_first_in_first_seen_order_with_its_index(write_testlist):
    path = write_testlist([
        {**gemm(m=1), "sources": ["a/x/q_proj"]},
        {**moe(), "sources": ["a/x/mlp"]},
        {**gemm(m=1, out="bf16"), "sources": ["b/y/q_proj"], "recipes": ["r1"]},     # `out` given: the same case
        {**gemm(m=2), "sources": []},
        {**gemm(m=1), "sources": ["c/z/q_proj", "a/x/q_proj"], "recipes": ["r1", "r2"]},
        {**moe(), "sources": ["a/x/mlp"]},
    ])
    testlist = read_testlist(path)
    assert testlist.entries == 6 and testlist.duplicates == 3 and len(testlist.cases) == 3
    assert testlist.indexes == [0, 1, 3]
    first, layer, other = testlist.cases
    assert first.args.m == 1 and first.sources == ["a/x/q_proj", "b/y/q_proj", "c/z/q_proj"]
    assert first.recipes == ["r1", "r2"]
    assert layer.sources == ["a/x/mlp"] and other.args.m == 2
    assert [i for i, _ in testlist.indexed()] == [0, 1, 3]
    assert testlist.merged_line() == ("3 duplicates merged (6 entries; each copy's sources and recipes joined "
                                      "its first copy's)")


def test_a_list_without_copies_says_nothing_and_keeps_every_case_object(write_testlist):
    testlist = read_testlist(write_testlist([gemm(m=1), gemm(m=2)]))
    assert testlist.duplicates == 0 and testlist.merged_line() is None and testlist.indexes == [0, 1]


def test_a_merged_case_keeps_its_key_and_the_deployment_sizes_union():
    a = Case.model_validate({**gemm(), "sources": ["m/a/q"], "metadata": {"deployment": {"tp": [8]}}})
    b = Case.model_validate({**gemm(), "sources": ["m/b/q"], "metadata": {"deployment": {"tp": [4]}}})
    (merged,) = merge_cases([a, b])
    assert merged.key() == a.key() and merged.metadata["deployment"] == {"tp": [4, 8]}
    assert merged.sources == ["m/a/q", "m/b/q"]


def _copies(n: int) -> list[Case]:
    """n copies of one case, each with a source of its own: the shape that made merging quadratic."""
    base = Case.model_validate(gemm())
    return [base.with_sources([f"org/model-{i}/q_proj"]) for i in range(n)]


def _seconds(n: int) -> float:
    """Seconds merge_indexed takes over n copies, the garbage collector held off: its full passes scale with
    everything the test process holds (the whole suite's objects), not with the merge."""
    cases = _copies(n)
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        merged, indexes = merge_indexed(cases)
        spent = time.perf_counter() - t0
    finally:
        gc.enable()
    assert len(merged) == 1 and len(merged[0].sources) == n and indexes == [0]
    return spent


def test_merging_is_linear_in_the_copies():
    """Twice the copies take under three times as long (quadratic would take four); best of three."""
    n = 20_000
    small = min(_seconds(n) for _ in range(3))
    large = min(_seconds(2 * n) for _ in range(3))
    assert large < 3 * small, (small, large)


def test_validate_and_show_say_how_many_duplicates_were_merged(write_testlist):
    path = write_testlist([gemm(m=1), {**gemm(m=1), "sources": ["a/b/c"]}, gemm(m=2), gemm(m=1)])
    r = CliRunner().invoke(app, ["testlist", "validate", str(path)])
    assert r.exit_code == 0, r.output
    assert r.output.strip().endswith(": 2 cases; 2 duplicates merged (4 entries; each copy's sources and recipes "
                                     "joined its first copy's)")
    r = CliRunner().invoke(app, ["testlist", "show", str(path)])
    assert r.exit_code == 0 and r.output.startswith("2 duplicates merged (4 entries") and "│     2 │" in r.output
