"""Opening a database: one SQLAlchemy engine per Store, connection settings for safe concurrent
use, and the translation of driver errors into one-line StoreErrors.

SQLite: WAL journal (readers never block the writer, the writer never blocks readers), a busy
timeout (a writer waits for another writer instead of failing), foreign keys on, and transactions
this code begins itself: `BEGIN IMMEDIATE` for writes, so two writers queue at the start instead
of one failing half-way. PostgreSQL: psycopg 3, a 5 s connect timeout, READ COMMITTED transactions.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.pool import QueuePool

from operatorx.store.errors import StoreError
from operatorx.store.target import PG_CONNECT_TIMEOUT_S, DbTarget, require_psycopg, sqlite_error_kind
from operatorx.store.writes import json_dumps

__all__ = ["make_engine", "translate", "transaction", "retrying", "busy_timeout_s", "set_wal", "sqlite_uri",
           "sqlite_needs_immutable"]

T = TypeVar("T")
_DEFAULT_BUSY_TIMEOUT_S = 30.0
_RETRY_ATTEMPTS = 6


def busy_timeout_s(given: float | None = None) -> float:
    """How long one statement waits for another process's lock: the argument, else
    OPERATORX_DB_BUSY_TIMEOUT_S, else 30 s."""
    if given is not None:
        return given
    env = os.environ.get("OPERATORX_DB_BUSY_TIMEOUT_S")
    try:
        return float(env) if env else _DEFAULT_BUSY_TIMEOUT_S
    except ValueError:
        raise StoreError(f"OPERATORX_DB_BUSY_TIMEOUT_S={env!r} is not a number of seconds: set it to e.g. 30") \
            from None


def sqlite_needs_immutable(path: Path) -> bool:
    """Whether a read-only open of `path` must say `immutable=1`: when its directory is not writable
    (a read-only mount, another user's directory) and the -wal and -shm are not both there already.
    Reading a WAL database otherwise needs SQLite to make them, and the open fails; `immutable` reads
    the file as it is, with no locks and no side files (rows only in a leftover -wal are not seen)."""
    if os.access(path.parent, os.W_OK | os.X_OK):
        return False
    return not all(path.with_name(path.name + s).exists() for s in ("-wal", "-shm"))


def sqlite_uri(path: Path, mode: str) -> str:
    """The URI SQLite opens: `mode=rwc|rw|ro`, plus `immutable=1` for a read where it is needed."""
    uri = f"file:{quote(str(path.absolute()))}?mode={mode}"
    return uri + "&immutable=1" if mode == "ro" and sqlite_needs_immutable(path) else uri


def make_engine(target: DbTarget, *, mode: str, timeout_s: float) -> Engine:
    """`mode` is SQLite's open mode: `rwc` (create if missing), `rw`, or `ro`. `ro` is a reader's
    promise on both kinds: SQLite opens `mode=ro` (and `immutable=1` where the directory cannot take
    the -wal/-shm) with `query_only`; it never removes the -wal/-shm its reads made, since deleting a
    -wal another process is about to write loses that process's commits. PostgreSQL sessions
    default to READ ONLY transactions."""
    if target.kind == "postgresql":
        require_psycopg(target)
        assert target.url is not None
        # pre-ping: a sweep's pooled connection may sit idle for an hour and be dropped by the server
        # or a proxy in between; a dead one is replaced on checkout instead of failing the write
        engine = create_engine(target.url, json_serializer=json_dumps, pool_pre_ping=True,
                               connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_S,
                                             "application_name": "operatorx"})
        if mode == "ro":
            event.listen(engine, "connect", _pg_read_only)
        return engine
    assert target.path is not None
    path = target.path

    def connect() -> sqlite3.Connection:
        # isolation_level=None: the driver begins nothing by itself; `transaction` below does. The URI
        # is made per connection: whether `immutable` is needed can change while a server runs.
        conn = sqlite3.connect(sqlite_uri(path, mode), uri=True, timeout=timeout_s, isolation_level=None,
                               check_same_thread=False)
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA synchronous=NORMAL")
        if mode == "ro":
            conn.execute("PRAGMA query_only=ON")
        return conn

    return create_engine("sqlite://", creator=connect, poolclass=QueuePool, pool_size=2, max_overflow=8,
                         json_serializer=json_dumps)


def _pg_read_only(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
    cur.close()
    dbapi_conn.commit()


def set_wal(conn: Connection) -> None:
    """Switch a SQLite database to WAL (persistent in the file; a no-op when it already is)."""
    mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
    if str(mode).lower() != "wal":
        conn.exec_driver_sql("PRAGMA journal_mode=WAL")
    conn.commit()


@contextmanager
def transaction(engine: Engine, target: DbTarget, *, write: bool) -> Iterator[Connection]:
    """One transaction: committed when the block ends, rolled back when it raises."""
    with engine.connect() as conn:
        if target.kind == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
        elif not write:                      # one snapshot for every statement of a read (run + its rows)
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
        try:
            yield conn
        except BaseException:
            conn.rollback()
            raise
        conn.commit()


def _transient(target: DbTarget, err: BaseException) -> bool:
    if not isinstance(err, DBAPIError):
        return False
    if target.kind == "sqlite":
        return sqlite_error_kind(err) == "locked"
    code = getattr(getattr(err, "orig", None), "sqlstate", None) or ""
    if err.connection_invalidated or code.startswith("08"):          # the connection dropped: a new one may do
        return True
    return code in ("40001", "40P01", "55P03")        # serialization failure, deadlock, lock not available


def retrying(target: DbTarget, what: str, fn: Callable[[], T]) -> T:
    """`fn()`, tried again (with a growing pause) while the database reports busy/locked or a
    serialization conflict; anything else, or still busy after the last try, is a StoreError."""
    pause = 0.05
    for attempt in range(_RETRY_ATTEMPTS):
        try:
            return fn()
        except IntegrityError:
            raise                              # the caller knows what a broken constraint means there
        except DBAPIError as err:
            if not _transient(target, err) or attempt == _RETRY_ATTEMPTS - 1:
                raise translate(target, err, what) from None
            time.sleep(pause)
            pause = min(pause * 3, 2.0)
    raise AssertionError("unreachable")


def _has_sqlite_magic(target: DbTarget) -> bool:
    try:
        with open(target.path or "", "rb") as f:
            return f.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def _first_line(err: BaseException) -> str:
    orig: Any = getattr(err, "orig", None) or err
    text = str(orig).strip().splitlines()
    return text[0] if text else type(orig).__name__


def translate(target: DbTarget, err: BaseException, what: str = "open") -> StoreError:
    """A driver error as one line naming the problem and the fix."""
    where = target.display()
    detail = target.scrub(_first_line(err))          # a driver may quote the connection string
    if target.kind == "sqlite":
        kind = sqlite_error_kind(err)
        if kind == "locked":
            return StoreError(f"{where} stayed locked by another program while trying to {what} (after the "
                              f"busy timeout and retries): close the program holding a write transaction on it, "
                              "or raise OPERATORX_DB_BUSY_TIMEOUT_S")
        if kind == "readonly":
            return StoreError(f"cannot {what}: {where} is read-only ({detail}): make the file and its directory "
                              "writable, or choose another --db path")
        if kind == "notadb" and not _has_sqlite_magic(target):
            return StoreError(f"{where} is not an SQLite database ({detail}): choose another --db path",
                              file_unusable=True)
        if kind in ("corrupt", "notadb"):         # an SQLite header over pages that make no sense
            return StoreError(f"{where} is corrupt ({detail}): restore it from a backup, or start a new --db "
                              "and `operatorx db ingest` the result documents into it", file_unusable=True)
        if kind == "cantopen":
            return StoreError(f"cannot open {where} ({detail}): check the path and its permissions")
        if kind == "full":
            return StoreError(f"cannot {what}: the disk holding {where} is full: free space or choose another "
                              "--db path")
        return StoreError(f"cannot {what} {where}: {detail}")
    low = detail.lower()
    url = target.url
    host = f"{url.host or 'localhost'}:{url.port or 5432}" if url is not None else where
    if "does not exist" in low and "database" in low:
        return StoreError(f"PostgreSQL at {host} has no database {url.database if url else ''!r}: create it "
                          f"with `operatorx db init {target.flag()}` (or createdb)")
    if "password" in low or "authentication" in low or ("role" in low and "does not exist" in low):
        return StoreError(f"PostgreSQL at {host} refused the login ({detail}): fix the user, or the password "
                          "(in --db, OPERATORX_DB, PGPASSWORD or ~/.pgpass)")
    if "permission denied" in low:
        return StoreError(f"PostgreSQL at {host}: cannot {what} ({detail}): the role in --db lacks the right; "
                          "ask the database's owner to grant it (or to create the database for you)")
    if "invalid response" in low or "ssl negotiation" in low or "not a postgres" in low:
        return StoreError(f"what answers at {host} is not a PostgreSQL server ({detail}): fix host and port in --db")
    if any(s in low for s in ("connection refused", "timeout", "timed out", "could not translate host",
                              "name or service not known", "no route", "network is unreachable",
                              "could not connect", "connection failed", "server closed")):
        return StoreError(f"cannot reach PostgreSQL at {host} within {PG_CONNECT_TIMEOUT_S} s ({detail}): start "
                          "the server, or fix host and port in --db")
    return StoreError(f"PostgreSQL at {host}: cannot {what} ({detail})")
