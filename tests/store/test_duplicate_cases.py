"""A testlist that repeats a case runs it once: one row, at its first copy's index, with every copy's sources."""

from __future__ import annotations

import time

from operatorx.backends import Check, Prepared, register_backend
from operatorx.measure import TimingSettings
from operatorx.run import RunConfig, run_testlist
from operatorx.store import Store
from tests.conftest import gemm

FAST = TimingSettings(warmup_calls=1, warmup_floor_s=0, first_warmup_floor_s=0, min_samples=3, max_samples=5,
                      max_time_s=0)
PREPARED: list[int] = []


class _Counting:
    name, op_type = "counting_for_test", "gemm"

    def supports(self, case, device):
        return None

    def prepare(self, case, device):
        PREPARED.append(case.args.m)
        return Prepared(fn=lambda: None, check=lambda: Check(0.0, 0.01, 1, "planted"))


register_backend("counting_for_test", "gemm", _Counting)


def test_three_copies_are_one_case_measured_once_with_every_source(tmp_path, db_url, write_testlist):
    PREPARED.clear()
    path = write_testlist([
        {**gemm(m=1, n=64, k=64), "sources": ["org/a/q_proj"]},
        {**gemm(m=2, n=64, k=64), "sources": ["org/a/o_proj"]},
        {**gemm(m=1, n=64, k=64), "sources": ["org/b/q_proj"]},
        {**gemm(m=1, n=64, k=64), "sources": ["org/c/q_proj", "org/a/q_proj"]},
    ])
    config = RunConfig(testlist=str(path), device="cpu", db=db_url, results_dir=tmp_path / "res", timing=FAST,
                       backend="counting_for_test", executor="inline")
    notes: list[str] = []

    class Reporter:
        def start(self, *a): ...
        def worker_ready(self, *a): ...
        def case_started(self, *a): ...
        def case_done(self, *a): ...
        def note(self, text): notes.append(text)
        def finish(self): ...

    outcome = run_testlist(config, Reporter())
    assert sorted(PREPARED) == [1, 2]                                   # each distinct case prepared once
    assert [(r.case_index, r.case.args.m, r.status) for r in outcome.rows] == [(0, 1, "ok"), (1, 2, "ok")]
    assert outcome.rows[0].case.sources == ["org/a/q_proj", "org/b/q_proj", "org/c/q_proj"]
    store = Store(db_url, create=False)
    doc = store.document(outcome.run_id)
    assert [r["op"]["sources"] for r in doc["rows"]] == [["org/a/q_proj", "org/b/q_proj", "org/c/q_proj"],
                                                         ["org/a/o_proj"]]
    assert doc["run"]["duplicates_merged"] == 2 and doc["run"]["cases_in_testlist"] == 2
    assert any("2 duplicate case(s) in the testlist merged" in n for n in notes), notes


def test_a_list_of_many_copies_plans_one_row_fast(tmp_path, write_testlist):
    """10^5 copies of one case (each its own source) plan and store one row; before, each copy was
    measured again (10^6 copies ran past 600 s)."""
    PREPARED.clear()
    copies = [{**gemm(m=1, n=64, k=64), "sources": [f"org/model-{i}/q_proj"]} for i in range(100_000)]
    path = write_testlist(copies)
    config = RunConfig(testlist=str(path), device="cpu", db=str(tmp_path / "ox.db"), results_dir=tmp_path / "res",
                       timing=FAST, backend="counting_for_test", executor="inline")
    t0 = time.perf_counter()
    outcome = run_testlist(config)
    spent = time.perf_counter() - t0
    assert PREPARED == [1] and len(outcome.rows) == 1 and len(outcome.rows[0].case.sources) == 100_000
    assert spent < 120, spent                                          # a generous bound: a shared CI machine
