from __future__ import annotations

import pytest

from operatorx.result import Row
from operatorx.spec import Case
from operatorx.store import RunNotFound, Store, document_csv
from tests.conftest import gemm


def _row(i: int, status: str = "ok") -> Row:
    case = Case.model_validate({**gemm(m=i + 1), "sources": ["a/b/q_proj"]})
    return Row(case=case, backend="torch", status=status, testlist="t", case_index=i,  # type: ignore[arg-type]
               message=None if status == "ok" else "why", error_kind="exception" if status == "error" else None,
               metrics={"scheme": "bf16", **({"latency_us": 1.5 * (i + 1)} if status == "ok" else {})})


def test_rows_are_committed_one_by_one_and_read_back(tmp_path):
    db = str(tmp_path / "r.db")
    store = Store(db)
    store.begin_run("run1", "2026-11-30T00:00:00", "t", "torch", "cpu", {"device": {"name": "x"}})
    store.add_row("run1", _row(0))
    # a second connection sees the committed row before the run ends (a crash loses nothing stored)
    assert Store(db).row_count("run1") == 1
    store.add_row("run1", _row(1, "unsupported"))
    store.finish_run("run1", "2026-11-30T00:01:00")
    doc = Store(db).document("latest")
    assert doc["schema_version"] == "1" and doc["run"]["state"] == "finished"
    assert [r["status"] for r in doc["rows"]] == ["ok", "unsupported"]
    assert doc["rows"][1]["message"] == "why"
    assert doc["rows"][0]["op"]["sources"] == ["a/b/q_proj"]
    csv = document_csv(doc)
    assert csv.splitlines()[0].startswith("case_index,type,label,m,n,k")
    assert len(csv.splitlines()) == 3


def test_run_prefix_and_missing_run(tmp_path):
    store = Store(str(tmp_path / "r.db"))
    store.begin_run("20261130-aaa", "2026-11-30T00:00:00", "t", "torch", "cpu", {})
    assert store.resolve_run("20261130") == "20261130-aaa"
    with pytest.raises(RunNotFound):
        store.resolve_run("nope")


def test_sqlalchemy_url_is_accepted(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'u.db'}")
    assert store.list_runs() == []


def test_run_prefix_is_literal_not_a_like_pattern(tmp_path):
    store = Store(str(tmp_path / "r.db"))
    store.begin_run("20261130-aaa", "2026-11-30T00:00:00", "t", "torch", "cpu", {})
    with pytest.raises(RunNotFound):
        store.resolve_run("2026_130")          # '_' would match any character in SQL LIKE


def test_the_row_upsert_is_built_once_and_still_replaces_a_row(tmp_path):
    """The upsert statement is cached per dialect (building it cost ~1 ms a row in the parent); a
    second write of the same identity still replaces the first."""
    from sqlalchemy import create_engine

    from operatorx.store import writes

    db = str(tmp_path / "u.db")
    store = Store(db)
    store.begin_run("run1", "2026-11-30T00:00:00", "t", "torch", "cpu", {"device": {"name": "x"}})
    store.add_row("run1", _row(0, "unsupported"))
    store.add_row("run1", _row(0))                      # the same case again: replaces, not adds
    assert Store(db).row_count("run1") == 1
    assert Store(db).rows("run1")[0].status == "ok"
    with create_engine(f"sqlite:///{db}").connect() as conn:
        assert writes._row_upsert(conn) is writes._row_upsert(conn)
