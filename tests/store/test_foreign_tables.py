"""`db upgrade` never drops a table it did not create: another application's `runs` and `rows` (same
names, other columns) stay with their data, on SQLite and PostgreSQL; OperatorX's own old layout is
still converted (tests/store/test_migrations.py)."""

from __future__ import annotations

from sqlalchemy import create_engine, inspect, text
from typer.testing import CliRunner

from operatorx.cli import app
from operatorx.store import Store
from tests.store.conftest import done, planned

runner = CliRunner()


def _engine(db_url: str):  # type: ignore[no-untyped-def]
    return create_engine(db_url if "://" in db_url else f"sqlite:///{db_url}")


def _foreign_app(db_url: str) -> None:
    """A ticketing app's tables that happen to be called `runs` and `rows`, with data."""
    engine = _engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE runs (id INTEGER PRIMARY KEY, pipeline TEXT NOT NULL, ok INTEGER)"))
        conn.execute(text("CREATE TABLE rows (id INTEGER PRIMARY KEY, run_id INTEGER REFERENCES runs(id), "
                          "payload TEXT)"))
        conn.execute(text("INSERT INTO runs VALUES (1, 'nightly', 1), (2, 'weekly', 0)"))
        conn.execute(text("INSERT INTO rows VALUES (10, 1, 'alpha'), (11, 1, 'beta'), (12, 2, 'gamma')"))
    engine.dispose()


def _foreign_data(db_url: str) -> tuple[list[tuple], list[tuple]]:
    engine = _engine(db_url)
    with engine.connect() as conn:
        runs = [tuple(r) for r in conn.execute(text("SELECT id, pipeline, ok FROM runs ORDER BY id"))]
        rows = [tuple(r) for r in conn.execute(text("SELECT id, run_id, payload FROM rows ORDER BY id"))]
    engine.dispose()
    return runs, rows


def test_db_upgrade_keeps_another_apps_runs_and_rows(db_url):
    _foreign_app(db_url)
    before = _foreign_data(db_url)
    assert before == ([(1, "nightly", 1), (2, "weekly", 0)], [(10, 1, "alpha"), (11, 1, "beta"), (12, 2, "gamma")])
    r = runner.invoke(app, ["db", "check", "--db", db_url])
    assert r.exit_code == 2 and "no OperatorX database yet" in r.output and "db upgrade" not in r.output, r.output
    r = runner.invoke(app, ["db", "upgrade", "--db", db_url])
    assert r.exit_code == 0, r.output
    assert "kept" not in r.output and "created the tables" in r.output
    assert "rows and runs are not OperatorX's and stayed as they were" in r.output, r.output
    assert _foreign_data(db_url) == before                      # every row of theirs, unchanged
    engine = _engine(db_url)
    with engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
    engine.dispose()
    assert {"runs", "rows", "ox_runs", "ox_rows", "ox_cases"} <= tables
    assert not {"ox_legacy_runs", "ox_legacy_rows"} & tables
    # OperatorX works beside them, and a second upgrade changes nothing of theirs either
    store = Store(db_url)
    store.begin_run("r", "2026-11-30T00:00:00", "t", "torch", "cpu", {}, planned(2))
    store.put_row("r", done(0))
    assert store.list_runs()[0]["counts"] == {"ok": 1, "unsupported": 0, "error": 0, "missing": 1}
    store.close()
    r = runner.invoke(app, ["db", "upgrade", "--db", db_url])
    assert r.exit_code == 0 and "nothing to do" in r.output
    assert _foreign_data(db_url) == before


def test_a_writing_command_on_a_database_with_foreign_tables_leaves_them(db_url):
    """`run` / `db ingest` create OperatorX's tables beside another app's: never theirs converted."""
    _foreign_app(db_url)
    before = _foreign_data(db_url)
    store = Store(db_url)
    store.begin_run("r", "2026-11-30T00:00:00", "t", "torch", "cpu", {}, planned(1))
    store.close()
    assert _foreign_data(db_url) == before


def test_one_table_of_the_old_layout_and_one_foreign_is_not_legacy(db_url):
    """`runs` in OperatorX's old columns but `rows` another app's: nothing is converted or dropped."""
    engine = _engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE runs (id VARCHAR(64) PRIMARY KEY, started_at VARCHAR(40), finished_at "
                          "VARCHAR(40), state VARCHAR(16), testlist TEXT, backend VARCHAR(128), device VARCHAR(16), "
                          "info TEXT)"))
        conn.execute(text("INSERT INTO runs VALUES ('x', 't', NULL, 'finished', 't', 'torch', 'cpu', '{}')"))
        conn.execute(text("CREATE TABLE rows (k TEXT, v TEXT)"))
        conn.execute(text("INSERT INTO rows VALUES ('a', 'b')"))
    engine.dispose()
    r = runner.invoke(app, ["db", "upgrade", "--db", db_url])
    assert r.exit_code == 0 and "stayed as they were" in r.output, r.output
    engine = _engine(db_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM runs")).scalar() == 1
        assert [tuple(x) for x in conn.execute(text("SELECT k, v FROM rows"))] == [("a", "b")]
    engine.dispose()
