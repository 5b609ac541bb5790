"""Schema versions: init, check, upgrade — and a database made before versions existed."""

from __future__ import annotations

import json
import secrets
from typing import Any, Optional

import pytest
from sqlalchemy import JSON, Float, ForeignKey, Integer, String, Text, create_engine, insert
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from typer.testing import CliRunner

from operatorx.cli import app
from operatorx.store import Store, StoreError
from tests.store.conftest import done

runner = CliRunner()


class _Old(DeclarativeBase):
    pass


class _OldRun(_Old):                  # the tables as OperatorX made them before schema versions
    __tablename__ = "runs"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    started_at: Mapped[str] = mapped_column(String(40))
    finished_at: Mapped[Optional[str]] = mapped_column(String(40), nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    testlist: Mapped[str] = mapped_column(Text)
    backend: Mapped[str] = mapped_column(String(128))
    device: Mapped[str] = mapped_column(String(16))
    info: Mapped[dict[str, Any]] = mapped_column(JSON)


class _OldRow(_Old):
    __tablename__ = "rows"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    case_index: Mapped[int] = mapped_column(Integer)
    case_key: Mapped[str] = mapped_column(Text)
    op_type: Mapped[str] = mapped_column(String(16))
    backend: Mapped[str] = mapped_column(String(128))
    testlist: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), index=True)
    message: Mapped[Optional[str]] = mapped_column(Text, nullable=True)
    latency_us: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    tflops: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    gbps: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    record: Mapped[dict[str, Any]] = mapped_column(JSON)


def _legacy_db(url: str) -> None:
    """Two runs, three rows each in the old layout; run `a` holds case 1 twice (the old code could)."""
    engine = create_engine(url if "://" in url else f"sqlite:///{url}")
    _Old.metadata.create_all(engine)
    with engine.begin() as conn:
        for rid, t in (("a", "2026-01-01T00:00:00"), ("b", "2026-01-02T00:00:00")):
            conn.execute(insert(_OldRun), [{"id": rid, "started_at": t, "finished_at": t, "state": "finished",
                                            "testlist": "t", "backend": "torch", "device": "cuda",
                                            "info": {"device": {"name": "NVIDIA H100"}, "driver": "570"}}])
            for i, lat in ((0, 1.0), (1, 2.0), (1, 3.0) if rid == "a" else (2, 4.0)):
                rec = done(i, lat).to_json()
                conn.execute(insert(_OldRow), [{"run_id": rid, "case_index": i, "case_key": "k", "op_type": "gemm",
                                                "backend": "torch", "testlist": "t", "status": "ok",
                                                "latency_us": lat, "record": rec}])
    engine.dispose()


def test_a_legacy_database_is_refused_then_upgraded(db_url):
    _legacy_db(db_url)
    with pytest.raises(StoreError, match="older OperatorX.*operatorx db upgrade"):
        Store(db_url)
    r = runner.invoke(app, ["results", "list", "--db", db_url])
    assert r.exit_code == 2 and "operatorx db upgrade --db" in r.output
    r = runner.invoke(app, ["db", "check", "--db", db_url])
    assert r.exit_code == 2 and "operatorx db upgrade" in r.output
    r = runner.invoke(app, ["db", "init", "--db", db_url])
    assert r.exit_code == 2 and "operatorx db upgrade" in r.output
    r = runner.invoke(app, ["db", "upgrade", "--db", db_url])
    assert r.exit_code == 0 and "upgraded" in r.output, r.output
    store = Store(db_url, create=False)
    runs = {r["id"]: r for r in store.list_runs()}
    assert runs["a"]["rows"] == 2 and runs["b"]["rows"] == 3        # case 1 of `a` once: the last copy
    assert runs["a"]["gpu"] == "NVIDIA H100" and runs["a"]["driver"] == "570"
    assert [r["metrics"]["latency_us"] for r in store.document("a")["rows"]] == [1.0, 3.0]
    assert runner.invoke(app, ["db", "check", "--db", db_url]).exit_code == 0
    r = runner.invoke(app, ["db", "upgrade", "--db", db_url])
    assert r.exit_code == 0 and "nothing to do" in r.output


def test_init_check_upgrade_on_a_fresh_database(tmp_path):
    db = str(tmp_path / "ox.db")
    r = runner.invoke(app, ["db", "check", "--db", db])
    assert r.exit_code == 2 and "no database at" in r.output
    r = runner.invoke(app, ["db", "init", "--db", db])
    assert r.exit_code == 0 and "created" in r.output
    r = runner.invoke(app, ["db", "init", "--db", db])
    assert r.exit_code == 0 and "already" in r.output
    r = runner.invoke(app, ["db", "check", "--db", db])
    assert r.exit_code == 0 and "schema 0002 (current), 0 runs, 0 rows" in r.output
    assert json.loads(json.dumps(Store(db).list_runs())) == []


def test_db_init_creates_a_postgresql_database_on_its_server(pg_server_db):
    import psycopg

    name = f"ox_store_init_{secrets.token_hex(4)}"
    url = pg_server_db.rsplit("/", 1)[0] + "/" + name
    try:
        r = runner.invoke(app, ["db", "init", "--db", url])
        assert r.exit_code == 0 and "created" in r.output, r.output
        r = runner.invoke(app, ["db", "check", "--db", url])
        assert r.exit_code == 0 and "current" in r.output
        Store(url).begin_run("r", "2026-11-30T00:00:00", "t", "torch", "cpu", {})
        r = runner.invoke(app, ["results", "list", "--db", url.replace("postgresql://", "postgres://")])
        assert r.exit_code == 0 and "r" in r.output
    finally:
        with psycopg.connect(pg_server_db.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_postgresql_tables_do_not_collide_with_other_apps(pg_url):
    """A shared PostgreSQL database may hold another app's tables and its own alembic_version."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num varchar(32) primary key)")
        conn.execute("INSERT INTO alembic_version VALUES ('abcdef')")
        conn.execute("CREATE TABLE runs (x int)")               # not OperatorX's legacy pair (no `rows`)
    store = Store(pg_url)
    store.begin_run("r", "2026-11-30T00:00:00", "t", "torch", "cpu", {})
    assert [r["id"] for r in store.list_runs()] == ["r"]


def test_the_migrations_build_exactly_the_tables_the_code_uses(db_url):
    """schema.py (what the code reads and writes) and the migration scripts (what databases get)
    must not drift apart."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from operatorx.store.schema import metadata

    store = Store(db_url)
    with store.engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn), metadata)
    assert [d for d in diffs if "ox_alembic_version" not in str(d)] == []
