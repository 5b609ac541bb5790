"""The Store API on SQLite and PostgreSQL alike."""

from __future__ import annotations

import pytest

from operatorx.result import Row
from operatorx.store import RunNotFound, Store, StoreError
from operatorx.store.migrate import script_head
from operatorx.store.schema import SCHEMA_HEAD
from tests.store.conftest import case, done, planned

T0 = "2026-11-30T00:00:00"


def _begin(store: Store, run_id: str = "run1", n: int = 4, **kw: object) -> None:
    store.begin_run(run_id, T0, "t", "torch", "cpu", {"device": {"name": "cpu"}, "host": "h1"}, planned(n),
                    **kw)  # type: ignore[arg-type]


def test_schema_head_matches_the_migration_scripts():
    assert script_head() == SCHEMA_HEAD


def test_planned_rows_are_missing_until_their_case_ends(db_url):
    store = Store(db_url)
    _begin(store, n=4)
    assert store.unfinished("run1") == [0, 1, 2, 3]
    store.put_row("run1", done(2, 5.0))
    store.put_row("run1", done(0, status="error"))
    assert store.unfinished("run1") == [1, 3]
    assert store.row_count("run1") == 4                 # replaced, not added
    [r] = store.list_runs()
    assert r["counts"] == {"ok": 1, "unsupported": 0, "error": 1, "missing": 2} and r["rows"] == 4
    assert r["state"] == "running" and r["gpu"] == "cpu"
    doc = store.document("run1")
    assert [x["status"] for x in doc["rows"]] == ["error", "missing", "ok", "missing"]
    assert doc["rows"][2]["metrics"]["latency_us"] == 5.0
    assert doc["run"]["host"] == "h1" and doc["run"]["state"] == "running"
    rows = store.rows("run1")
    assert isinstance(rows[2], Row) and rows[2].latency_us == 5.0 and rows[1].status == "missing"


def test_a_row_written_twice_is_stored_once_the_last_one_wins(db_url):
    store = Store(db_url)
    _begin(store, n=2)
    for lat in (1.0, 2.0, 3.0):
        store.put_row("run1", done(1, lat))
    assert store.row_count("run1") == 2
    assert store.document("run1")["rows"][1]["metrics"]["latency_us"] == 3.0


def test_sides_and_backends_are_separate_rows(db_url):
    store = Store(db_url)
    store.begin_run("ab1", T0, "t", "ab", "cpu", {"kind": "ab"},
                    planned(2, side="A") + planned(2, side="B"))
    store.put_row("ab1", done(0, 1.0, side="A"))
    store.put_row("ab1", done(0, 2.0, side="B"))
    store.put_row("ab1", done(0, 3.0, side="B", backend="other"))     # another backend: its own row
    doc = store.document("ab1")
    assert store.row_count("ab1") == 5
    assert [(r["case_index"], r["side"]) for r in doc["rows"]][:2] == [(0, "A"), (0, "B")]
    assert store.list_runs()[0]["kind"] == "ab"


def test_begin_run_twice_is_refused(db_url):
    store = Store(db_url)
    _begin(store)
    with pytest.raises(StoreError, match="already exists"):
        _begin(store)
    assert store.row_count("run1") == 4


def test_put_row_into_an_unknown_run(db_url):
    store = Store(db_url)
    with pytest.raises(RunNotFound):
        store.put_row("nope", done(0))
    with pytest.raises(RunNotFound):
        store.put_rows("nope", [done(0), done(1)])


def test_rows_stored_together_replace_their_planned_rows(db_url):
    store = Store(db_url)
    _begin(store, n=4)
    store.put_rows("run1", [done(3, 7.0), done(1, status="error"), done(3, 8.0)])   # the later write of 3 wins
    store.put_rows("run1", [])
    assert store.unfinished("run1") == [0, 2] and store.row_count("run1") == 4
    doc = store.document("run1")
    assert [x["status"] for x in doc["rows"]] == ["missing", "error", "missing", "ok"]
    assert doc["rows"][3]["metrics"]["latency_us"] == 8.0


def test_finish_reopen_and_finish_again(db_url):
    store = Store(db_url)
    _begin(store, n=2)
    store.finish_run("run1", "2026-11-30T00:01:00", "interrupted")
    assert store.document("run1")["run"]["state"] == "interrupted"
    store.reopen_run("run1")
    run = store.document("run1")["run"]
    assert run["state"] == "running" and run["finished_at"] is None
    for i in store.unfinished("run1"):
        store.put_row("run1", done(i))
    store.finish_run("run1", "2026-11-30T00:02:00")
    assert store.document("run1")["run"]["finished_at"] == "2026-11-30T00:02:00"
    assert store.unfinished("run1") == []
    with pytest.raises(ValueError):
        store.finish_run("run1", T0, "running")
    with pytest.raises(RunNotFound):
        store.finish_run("nope", T0)


def test_run_info_and_its_update_reach_the_typed_columns(db_url):
    store = Store(db_url)
    _begin(store, run_group="g1", shard="0/2")
    store.update_run_info("run1", {"device": {"name": "NVIDIA H200", "uuid": "GPU-1", "pci_bus_id": "0000:01:00.0"},
                                   "driver": "580.1", "software": {"torch": "2.13", "vllm": "0.27"}})
    info = store.run_info("run1")
    assert info["host"] == "h1" and info["driver"] == "580.1"
    [r] = store.list_runs()
    assert (r["gpu"], r["driver"], r["run_group"], r["shard"]) == ("NVIDIA H200", "580.1", "g1", "0/2")
    from sqlalchemy import select

    from operatorx.store.schema import runs
    with store.engine.connect() as conn:
        got = conn.execute(select(runs.c.gpu_uuid, runs.c.gpu_pci_bus_id, runs.c.vllm_version)).one()
    assert tuple(got) == ("GPU-1", "0000:01:00.0", "0.27")
    with pytest.raises(RunNotFound):
        store.run_info("nope")


def test_typed_row_columns(db_url):
    from sqlalchemy import select

    from operatorx.store.schema import cases, rows
    store = Store(db_url)
    _begin(store, n=1)
    store.put_row("run1", done(0, 4.0))
    with store.engine.connect() as conn:
        r = conn.execute(select(rows)).one()
        assert conn.execute(select(cases.c.type)).scalars().all() == ["gemm"]
    assert (r.status, r.latency_us, r.tflops, r.gbps, r.scheme) == ("ok", 4.0, 1.5, 300.0, "bf16")
    assert (r.m, r.n, r.k, r.model, r.role, r.samples_us) == (1, 256, 256, "org/model-x", "q_proj", [4.0] * 3)


def test_resolve_run_prefix_latest_and_ambiguity(db_url):
    store = Store(db_url)
    store.begin_run("20261130-aaa", T0, "t", "torch", "cpu", {})
    store.begin_run("20261130-aab", "2026-11-30T00:00:01", "t", "torch", "cpu", {})
    store.begin_run("20261201-x", "2026-12-01T00:00:00", "t", "torch", "cpu", {})
    assert store.resolve_run("latest") == "20261201-x"
    assert store.resolve_run("20261130-aaa") == "20261130-aaa"
    assert store.resolve_run("20261201") == "20261201-x"
    with pytest.raises(RunNotFound, match="20261130-aaa, 20261130-aab"):
        store.resolve_run("20261130")
    with pytest.raises(RunNotFound):
        store.resolve_run("2026_130")            # '_' is not a wildcard
    assert [r["id"] for r in store.list_runs()] == ["20261201-x", "20261130-aab", "20261130-aaa"]


def test_a_second_store_sees_committed_rows(db_url):
    store = Store(db_url)
    _begin(store, n=2)
    store.put_row("run1", done(0))
    assert Store(db_url, create=False).unfinished("run1") == [1]


def test_patch_metrics_updates_record_and_columns(db_url):
    store = Store(db_url)
    _begin(store, n=2)
    store.put_row("run1", done(0, 2.0))
    assert store.patch_metrics("run1", {0: {"counters": {"duration_us": 1.0}, "latency_us": 9.0}}) == 1
    row = store.document("run1")["rows"][0]
    assert row["metrics"]["counters"] == {"duration_us": 1.0} and row["metrics"]["scheme"] == "bf16"
    assert store.rows("run1")[0].latency_us == 9.0


def test_cases_are_shared_between_runs(db_url):
    from sqlalchemy import func, select

    from operatorx.store.schema import cases
    store = Store(db_url)
    _begin(store, "r1", n=3)
    _begin(Store(db_url), "r2", n=3)
    with store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(cases)).scalar() == 3
    assert case(0).key() != case(1).key()
