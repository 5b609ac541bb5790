"""Schema versions: what a database holds, and bringing it to `SCHEMA_HEAD` with Alembic.

Migrations run in-process on a connection this module has locked (SQLite: `BEGIN IMMEDIATE`;
PostgreSQL: a transaction-scoped advisory lock), so any number of processes may create or upgrade
one database at once: the first does the work, the others wait and then find it done. DDL is
transactional on both, so a failed migration leaves the database as it was.

A database made before migrations existed (tables `runs` and `rows` with exactly the columns
OperatorX gave them, no version table) is "legacy": `operatorx db upgrade` creates the current tables
beside them, copies every run and row across (duplicate rows collapse to the last one stored) and
drops the old tables, in one transaction. Tables named `runs` / `rows` with other columns are another
application's: OperatorX never converts or drops a table it did not create.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from sqlalchemy import Connection, Engine, inspect, text

from operatorx.store.engine import set_wal, transaction
from operatorx.store.schema import SCHEMA_HEAD
from operatorx.store.target import DbTarget

__all__ = ["SchemaState", "schema_state", "upgrade_to_head", "VERSION_TABLE", "script_head", "is_legacy_layout",
           "foreign_tables"]

VERSION_TABLE = "ox_alembic_version"
SchemaState = Literal["empty", "legacy", "current", "older", "newer", "unversioned"]
_MIGRATIONS = Path(__file__).with_name("migrations")
_PG_LOCK_KEY = 0x6F78_5343          # "oxSC": serializes schema changes between processes


def schema_state(conn: Connection) -> tuple[SchemaState, str | None]:
    """(state, revision found). `older` and `newer` compare the stored revision with SCHEMA_HEAD."""
    tables = set(inspect(conn).get_table_names())
    if VERSION_TABLE in tables:
        rev = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()
        if rev is None:
            return ("empty", None) if "ox_runs" not in tables else ("unversioned", None)
        if rev == SCHEMA_HEAD:
            return "current", rev
        return ("older" if rev in _known_revisions() else "newer"), rev
    if "ox_runs" in tables:
        return "unversioned", None
    if {"runs", "rows"} <= tables and is_legacy_layout(conn):
        return "legacy", None
    return "empty", None


# The columns OperatorX gave `runs` and `rows` before schema versions (store/schema.py up to 1134776).
# Tables of those names with any other columns belong to another application: they are never
# converted or dropped, and OperatorX's own tables (all `ox_`) go beside them.
LEGACY_COLUMNS = {
    "runs": frozenset({"id", "started_at", "finished_at", "state", "testlist", "backend", "device", "info"}),
    "rows": frozenset({"id", "run_id", "case_index", "case_key", "op_type", "backend", "testlist", "status",
                       "message", "latency_us", "tflops", "gbps", "record"}),
}


def is_legacy_layout(conn: Connection) -> bool:
    """True when `runs` and `rows` have exactly the columns an older OperatorX made: only then are
    they OperatorX's to convert and drop (a same-named pair of another app is left alone)."""
    insp = inspect(conn)
    return all({c["name"] for c in insp.get_columns(table)} == cols for table, cols in LEGACY_COLUMNS.items())


def foreign_tables(conn: Connection) -> list[str]:
    """`runs` / `rows` tables present but not in OperatorX's old layout (another app's), by name."""
    found = set(inspect(conn).get_table_names()) & set(LEGACY_COLUMNS)
    if found == set(LEGACY_COLUMNS) and is_legacy_layout(conn):
        return []
    return sorted(found)


def _known_revisions() -> set[str]:
    """Every revision among this version's migration scripts (a revision not among them was made by
    a newer OperatorX)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    return {s.revision for s in ScriptDirectory.from_config(cfg).walk_revisions()}


def _alembic_config(conn: Connection) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    cfg.attributes["connection"] = conn
    cfg.attributes["version_table"] = VERSION_TABLE
    return cfg


def script_head() -> str:
    """The newest revision among the migration scripts (a test keeps SCHEMA_HEAD equal to it)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None
    return head


def _lock(conn: Connection, target: DbTarget) -> None:
    if target.kind == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})


def upgrade_to_head(engine: Engine, target: DbTarget, *, adopt_legacy: bool) -> tuple[SchemaState, str | None]:
    """Bring the database to SCHEMA_HEAD; returns the state it was found in (under the lock).
    A legacy database is converted only with `adopt_legacy`; otherwise it is returned untouched,
    as is one that is `newer` or `unversioned` (the caller explains those)."""
    from alembic import command

    if target.kind == "sqlite":
        with engine.connect() as conn:
            set_wal(conn)
    with transaction(engine, target, write=True) as conn:
        _lock(conn, target)
        state, rev = schema_state(conn)
        if state in ("current", "newer", "unversioned") or (state == "legacy" and not adopt_legacy):
            return state, rev
        if state == "legacy":
            _rename_legacy(conn)
        command.upgrade(_alembic_config(conn), "head")
        if state == "legacy":
            _copy_legacy(conn)
        return state, rev


def _rename_legacy(conn: Connection) -> None:
    insp = inspect(conn)
    for table in ("rows", "runs"):
        for ix in insp.get_indexes(table):
            if ix.get("name"):
                conn.execute(text(f'DROP INDEX IF EXISTS "{ix["name"]}"'))
    conn.execute(text('ALTER TABLE "rows" RENAME TO ox_legacy_rows'))
    conn.execute(text('ALTER TABLE "runs" RENAME TO ox_legacy_runs'))


def _copy_legacy(conn: Connection) -> None:
    """Every legacy run and row into the current tables (the same code path as ingest)."""
    import json

    from operatorx.store.writes import insert_run, upsert_rows

    def as_dict(v: Any) -> dict[str, Any]:
        return json.loads(v) if isinstance(v, str) else dict(v or {})

    runs = conn.execute(text("SELECT id, started_at, finished_at, state, testlist, backend, device, info "
                             "FROM ox_legacy_runs")).all()
    for r in runs:
        info = as_dict(r.info)
        insert_run(conn, run_id=r.id, started_at=r.started_at, finished_at=r.finished_at, state=r.state,
                   testlist=r.testlist, backend=r.backend, device=r.device, info=info,
                   run_group=None, shard=None)
        records = conn.execute(text("SELECT record FROM ox_legacy_rows WHERE run_id = :r ORDER BY id"),
                               {"r": r.id}).scalars().all()
        upsert_rows(conn, r.id, [as_dict(x) for x in records])
    conn.execute(text("DROP TABLE ox_legacy_rows"))
    conn.execute(text("DROP TABLE ox_legacy_runs"))
