"""`operatorx db init|upgrade|check`: make, upgrade and inspect a database on purpose (the only
places a PostgreSQL database or a legacy upgrade is ever created or done)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from operatorx.store.db import _remove_new_sidecars, _sidecars, state_error
from operatorx.store.engine import busy_timeout_s, make_engine, retrying, translate
from operatorx.store.errors import StoreError
from operatorx.store.migrate import SchemaState, foreign_tables, schema_state, upgrade_to_head
from operatorx.store.schema import SCHEMA_HEAD
from operatorx.store.target import DbTarget, check_sqlite_path, parse_db

__all__ = ["DbStatus", "init_database", "upgrade_database", "check_database"]


@dataclass(frozen=True)
class DbStatus:
    where: str
    state: SchemaState
    revision: Optional[str]
    runs: Optional[int] = None
    rows: Optional[int] = None

    @property
    def current(self) -> bool:
        return self.state == "current"


def _engine(target: DbTarget, *, create: bool) -> Engine:
    if target.kind == "sqlite":
        check_sqlite_path(target, create=create, write=True)
    return make_engine(target, mode="rwc" if create else "rw", timeout_s=busy_timeout_s())


def _create_pg_database(target: DbTarget) -> bool:
    """CREATE DATABASE when the server lacks it (through its `postgres` database). True if made."""
    assert target.url is not None
    name = target.url.database
    admin = make_engine(DbTarget(target.spec, "postgresql", url=target.url.set(database="postgres")), mode="",
                        timeout_s=busy_timeout_s())
    try:
        with admin.connect() as conn:
            if conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first():
                return False
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            quoted = '"' + str(name).replace('"', '""') + '"'
            conn.exec_driver_sql(f"CREATE DATABASE {quoted}")
        return True
    except DBAPIError as err:
        if "already exists" in str(err):
            return False
        raise translate(target, err, "create the database") from None
    finally:
        admin.dispose()


def _upgrade(target: DbTarget, engine: Engine, *, adopt_legacy: bool, existed: list[bool]) -> SchemaState:
    try:
        found, rev = retrying(target, "upgrade", lambda: upgrade_to_head(engine, target, adopt_legacy=adopt_legacy))
    except StoreError as err:
        engine.dispose()
        _remove_new_sidecars(target, existed, err)
        raise
    except BaseException:
        engine.dispose()
        raise
    engine.dispose()
    if found in ("newer", "unversioned") or (found == "legacy" and not adopt_legacy):
        raise state_error(target, found, rev)
    return found


def init_database(db: str) -> str:
    """Create the database (a PostgreSQL one on its server too) at the current schema. A legacy or
    older database is refused with the upgrade command. Returns what was done, in words."""
    target = parse_db(db)
    made = False
    if target.kind == "postgresql":
        made = _create_pg_database(target)
    elif target.path is not None and not target.path.exists():
        made = True
    existed = [f.exists() for f in _sidecars(target)]
    found = _upgrade(target, _engine(target, create=True), adopt_legacy=False, existed=existed)
    if found == "older":
        raise state_error(target, found, None)
    if found == "current" and not made:
        return f"{target.display()} is already an OperatorX database (schema {SCHEMA_HEAD})"
    return f"created {target.display()} (schema {SCHEMA_HEAD})"


def upgrade_database(db: str) -> str:
    target = parse_db(db)
    existed = [f.exists() for f in _sidecars(target)]
    found = _upgrade(target, _engine(target, create=False), adopt_legacy=True, existed=existed)
    if found == "current":
        return f"{target.display()} is at the current schema ({SCHEMA_HEAD}); nothing to do"
    if found == "legacy":
        return f"upgraded {target.display()} from the unversioned layout to schema {SCHEMA_HEAD} (runs and rows kept)"
    if found == "empty":
        others = _foreign_tables(target)
        kept = (f"; {' and '.join(others)} {'is' if len(others) == 1 else 'are'} not OperatorX's and "
                "stayed as they were") if others else ""
        return f"created the tables in {target.display()} (schema {SCHEMA_HEAD}){kept}"
    return f"upgraded {target.display()} to schema {SCHEMA_HEAD}"


def _foreign_tables(target: DbTarget) -> list[str]:
    """Another application's `runs` / `rows` beside OperatorX's tables (named in `db upgrade`'s line,
    so nobody reads "created" as "converted")."""
    engine = make_engine(target, mode="ro", timeout_s=busy_timeout_s())
    try:
        with engine.connect() as conn:
            return foreign_tables(conn)
    except DBAPIError:
        return []
    finally:
        engine.dispose()


def check_database(db: str) -> DbStatus:
    """The database's schema state, and its run and row counts when it is current. Never writes."""
    target = parse_db(db)
    if target.kind == "sqlite":
        check_sqlite_path(target, create=False, write=False)
    existed = [f.exists() for f in _sidecars(target)]
    engine = make_engine(target, mode="ro", timeout_s=busy_timeout_s())
    try:
        with engine.connect() as conn:
            state, rev = schema_state(conn)
            if state != "current":
                return DbStatus(target.display(), state, rev)
            if target.kind == "sqlite":          # the whole file, page by page: what opening does not read
                found = [str(r[0]) for r in conn.execute(text("PRAGMA quick_check(5)"))]
                if found != ["ok"]:
                    said = [ln.strip() for f in found for ln in f.splitlines() if ln.strip() and "***" not in ln]
                    raise StoreError(f"{target.display()} is corrupt ({'; '.join(said)[:200]}): restore it from a "
                                     "backup, or start a new --db and `operatorx db ingest` the result documents")
            runs = conn.execute(text("SELECT count(*) FROM ox_runs")).scalar()
            rows = conn.execute(text("SELECT count(*) FROM ox_rows")).scalar()
            return DbStatus(target.display(), state, rev, int(runs or 0), int(rows or 0))
    except DBAPIError as err:
        engine.dispose()
        failure = translate(target, err, "check")
        _remove_new_sidecars(target, existed, failure)
        raise failure from None
    finally:
        engine.dispose()
