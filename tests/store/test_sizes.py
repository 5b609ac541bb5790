"""Every size a case may give (up to 2^63 - 1) is stored, on SQLite and PostgreSQL, in a database
migrated from schema 0001 (where PostgreSQL's size columns were INTEGER: m = 2^31 was refused there)."""

from __future__ import annotations

from alembic import command
from sqlalchemy import select, text
from typer.testing import CliRunner

from operatorx.cli import app
from operatorx.result import Row
from operatorx.spec import Case
from operatorx.store import Store
from operatorx.store.engine import make_engine, transaction
from operatorx.store.migrate import _alembic_config
from operatorx.store.schema import SCHEMA_HEAD, rows
from operatorx.store.target import parse_db
from tests.conftest import gemm, moe

SIZES = (2**31, 2**63 - 1)


def _schema_0001(db: str) -> None:
    """A database as OperatorX made it at schema 0001, holding one run with one row."""
    target = parse_db(db)
    engine = make_engine(target, mode="rwc", timeout_s=5)
    with transaction(engine, target, write=True) as conn:
        command.upgrade(_alembic_config(conn), "0001")
    engine.dispose()


def _typed(db: str, run_id: str, column: str) -> list[int]:
    store = Store(db, create=False)
    with store.engine.connect() as conn:
        got = conn.execute(select(getattr(rows.c, column)).where(rows.c.run_id == run_id)
                           .order_by(rows.c.case_index)).scalars().all()
    store.close()
    return [int(v) for v in got if v is not None]


def test_a_migrated_database_stores_sizes_up_to_2_63(db_url):
    _schema_0001(db_url)
    r = CliRunner().invoke(app, ["results", "list", "--db", db_url])
    assert r.exit_code == 2 and "older than this OperatorX" in r.output and "db upgrade" in r.output
    r = CliRunner().invoke(app, ["db", "upgrade", "--db", db_url])
    assert r.exit_code == 0 and f"schema {SCHEMA_HEAD}" in r.output, r.output
    store = Store(db_url)
    cases = [Case.model_validate(gemm(m=m)) for m in SIZES] + [Case.model_validate(moe(tokens=SIZES[1]))]
    planned = [Row.missing(c, "torch", "t", i) for i, c in enumerate(cases)]
    store.begin_run("sizes", "2026-12-01T00:00:00", "t", "torch", "cpu", {}, planned)
    final = Row(case=cases[1], backend="torch", status="unsupported", testlist="t", case_index=2**63 - 1,
                message="too large for a CPU")
    store.put_row("sizes", final)
    assert _typed(db_url, "sizes", "m") == [2**31, 2**63 - 1]
    assert _typed(db_url, "sizes", "tokens") == [2**63 - 1]
    assert _typed(db_url, "sizes", "case_index") == [0, 2, 2**63 - 1]
    back = {r.case_index: r for r in store.rows("sizes")}
    assert back[2**63 - 1].status == "unsupported" and back[2**63 - 1].case.args.m == 2**63 - 1
    assert back[0].case.args.m == 2**31


def test_postgresql_size_columns_are_bigint_after_the_migration(pg_url):
    _schema_0001(pg_url)
    assert CliRunner().invoke(app, ["db", "upgrade", "--db", pg_url]).exit_code == 0
    store = Store(pg_url)
    with store.engine.connect() as conn:
        types = dict(conn.execute(text(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'ox_rows' "
            "AND column_name IN ('m', 'n', 'k', 'tokens', 'case_index')")).all())
    assert types == dict.fromkeys(("m", "n", "k", "tokens", "case_index"), "bigint")


def test_a_fresh_database_is_at_the_new_schema_and_stores_2_31(db_url):
    store = Store(db_url)
    store.begin_run("r", "2026-12-01T00:00:00", "t", "torch", "cpu", {},
                    [Row.missing(Case.model_validate(gemm(m=2**31, n=2**40, k=2**62)), "torch", "t", 0)])
    assert _typed(db_url, "r", "m") == [2**31] and _typed(db_url, "r", "k") == [2**62]
    r = CliRunner().invoke(app, ["db", "check", "--db", db_url])
    assert r.exit_code == 0 and f"schema {SCHEMA_HEAD} (current)" in r.output


def test_a_document_with_a_size_past_64_bits_is_refused_by_ingest_not_a_traceback(tmp_path, db_url):
    import json

    row = Row.missing(Case.model_validate(gemm()), "torch", "t", 0).to_json()
    row["op"]["args"]["m"] = 2**64
    doc = {"schema_version": "1", "rows": [row],
           "run": {"id": "big", "started_at": "2026-12-01T00:00:00", "state": "finished", "testlist": "t",
                   "backend": "torch"}}
    path = tmp_path / "big.json"
    path.write_text(json.dumps(doc))
    r = CliRunner().invoke(app, ["db", "ingest", str(path), "--db", db_url])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    assert f"big.json: rows[0] is not a result row (Case: args.m: {2**64} is above 2^63 - 1" in r.output
