"""Loading, planning and storing a testlist grow linearly with its cases (bench/scale_testlist.py times
10^5 and 10^6; docs/benchmarks.md, "Scale of a testlist"). Times are compared, never asserted: twice the
cases must take under three times as long (quadratic work takes four)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from operatorx.result import Row
from operatorx.run.plan import select_cases
from operatorx.spec.testlist import read_testlist
from operatorx.store import Store


def _write(path: Path, n: int) -> None:
    cases = [{"type": "gemm", "sources": [f"org/model/layers.{i % 61}.q_proj"],
              "args": {"m": i + 1, "n": 256, "k": 512, "a": {"dtype": "bf16"}, "b": {"dtype": "bf16"}}}
             for i in range(n)]
    path.write_text(json.dumps(cases))


def _seconds(tmp_path: Path, n: int, attempt: int) -> float:
    path = tmp_path / f"list-{n}.json"
    if not path.exists():
        _write(path, n)
    db = str(tmp_path / f"ox-{n}-{attempt}.db")
    t0 = time.perf_counter()
    testlist = read_testlist(path)
    chosen = select_cases(testlist.cases, None, None, None, indexes=testlist.indexes)
    planned = [Row.missing(c, "torch", "t", i) for i, c in chosen]
    Store(db).begin_run("r", "2026-12-01T00:00:00", "t", "torch", "cpu", {}, planned)
    spent = time.perf_counter() - t0
    assert Store(db).row_count("r") == n
    return spent


def test_load_plan_and_store_are_linear_in_the_cases(tmp_path):
    n = 3_000
    small = min(_seconds(tmp_path, n, a) for a in range(3))
    large = min(_seconds(tmp_path, 2 * n, a) for a in range(3))
    assert large < 3 * small, (small, large)


def _stored(db: str, run_id: str) -> tuple[list[tuple], list[tuple]]:
    """Every column of the run's rows (but ids) and of their cases, as stored, text as the database holds it."""
    from sqlalchemy import text

    store = Store(db, create=False)
    with store.engine.connect() as conn:
        names = [c for c in conn.execute(text("SELECT * FROM ox_rows LIMIT 0")).keys() if c not in ("id", "case_id")]
        rows_ = [tuple(r) for r in conn.execute(text(
            f"SELECT {', '.join(names)} FROM ox_rows WHERE run_id = :r ORDER BY case_index"), {"r": run_id})]
        cases = [tuple(r) for r in conn.execute(text(
            "SELECT key_sha256, case_key, type, label, args, sources FROM ox_cases ORDER BY key_sha256"))]
    store.close()
    return rows_, cases


def test_a_plan_is_stored_exactly_as_its_missing_rows_would_be(tmp_path):
    """`Plan` takes its own way into SQLite (writes.upsert_plan); the stored rows, cases and document
    text are those of `Row.missing(...)` through `upsert_rows`."""
    from operatorx.result import Plan
    from operatorx.spec import Case
    from tests.conftest import fp8_block, gemm, moe

    cases = [Case.model_validate(c) for c in (
        {**gemm(m=3), "sources": ["org/m/layers.0.q_proj", "org/n/x"]}, {**moe(), "sources": ["org/m/mlp"]},
        fp8_block(), {**gemm(m=2**63 - 1, parallel={"tp": 8}), "sources": ["bare"]},
        {**gemm(m=5), "sources": ["org/ü-ñ/q"], "recipes": ["r"]})]
    chosen = [(i * 3, c) for i, c in enumerate(cases)]
    for name in ("a", "b"):
        Store(str(tmp_path / f"{name}.db")).begin_run(
            "r", "2026-12-01T00:00:00", "t\udcff", "torch", "cpu", {},
            Plan(chosen, "py:x.py:f\udcff", "list\udcff.json") if name == "a" else
            [Row.missing(c, "py:x.py:f\udcff", "list\udcff.json", i) for i, c in chosen])
    assert _stored(str(tmp_path / "a.db"), "r") == _stored(str(tmp_path / "b.db"), "r")
    doc = Store(str(tmp_path / "a.db")).document("r")
    assert [Row.from_json(d).to_json() for d in doc["rows"]] == [
        Row.missing(c, "py:x.py:f\ufffd", "list\ufffd.json", i).to_json() for i, c in chosen]
