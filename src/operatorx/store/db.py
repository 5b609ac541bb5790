"""The results database: SQLite by default, PostgreSQL when given a `postgresql://` URL.

A run is stored when it begins, with one `missing` row per planned case; each case's row replaces
its planned row when the parent takes it in (committed at once: alone, or with the rows that finished
while the parent was storing the last ones, so a crash loses at most the cases in flight and the
rows waiting for the parent, and `unfinished` says what a resume still has to run). Writes that meet
a busy database wait and retry; anything that still fails is a StoreError with one line that says
what to do.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional, TypeVar, overload

from sqlalchemy import Connection, delete, func, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from operatorx.bulk import gc_paused
from operatorx.result import SCHEMA_VERSION, Plan, Row
from operatorx.store.columns import RUN_FIELDS, row_values, run_values
from operatorx.store.engine import busy_timeout_s as _busy_timeout_s
from operatorx.store.engine import make_engine, retrying, transaction, translate
from operatorx.store.errors import RunNotFound, StoreError
from operatorx.store.migrate import SchemaState, schema_state, upgrade_to_head
from operatorx.store.schema import RUN_STATES, SCHEMA_HEAD, rows, runs
from operatorx.store.target import DbTarget, check_sqlite_path, parse_db
from operatorx.store.writes import insert_run, upsert_plan, upsert_rows

__all__ = ["Store", "RunNotFound", "StoreError", "database_url", "check_db"]

T = TypeVar("T")
_STATUSES = ("ok", "unsupported", "error", "missing")


def database_url(db: str) -> str:
    """What a `--db` names, as messages print it (a path, or a URL without its password)."""
    return parse_db(db).display()


def _sqlite_mode(target: DbTarget, create: bool) -> str:
    if target.path is None:             # PostgreSQL: no mode
        return ""
    if create:
        return "rwc"
    return "rw" if os.access(target.path, os.W_OK) else "ro"


def _sidecars(target: DbTarget) -> list[Path]:
    if target.path is None:
        return []
    return [target.path.with_name(target.path.name + suffix) for suffix in ("-wal", "-shm")]


def _remove_new_sidecars(target: DbTarget, existed: list[bool], err: StoreError) -> None:
    """After a failed open: remove the -wal/-shm files that opening made beside a file that turned
    out not to be a database or corrupt, so a refused --db leaves the directory as it was.

    Only then: a database that is merely empty, of another schema version, or locked may be in use
    by another process (a run creating it this instant), and its -wal is that process's data. Removed
    under a live writer, the writer goes on committing into the unlinked file: readers see none of its
    rows, and a kill loses them all."""
    files = _sidecars(target)
    if not err.file_unusable or not files or any(existed) or not files[0].exists() or files[0].stat().st_size:
        return
    for f in files:
        f.unlink(missing_ok=True)


def state_error(target: DbTarget, state: SchemaState, rev: Optional[str]) -> StoreError:
    where, flag = target.display(), target.flag()
    if state == "empty":
        return StoreError(f"{where} holds no OperatorX database yet: create one with `operatorx db init {flag}`")
    if state == "legacy":
        return StoreError(f"{where} was made by an older OperatorX (before schema versions): run "
                          f"`operatorx db upgrade {flag}`")
    if state == "older":
        return StoreError(f"{where} has schema {rev}, older than this OperatorX's {SCHEMA_HEAD}: run "
                          f"`operatorx db upgrade {flag}`")
    if state == "newer":
        return StoreError(f"{where} has schema {rev}, newer than this OperatorX knows ({SCHEMA_HEAD}): upgrade "
                          "OperatorX (pip install -U operatorx)")
    return StoreError(f"{where} has OperatorX tables but no schema version: restore it from a backup, or "
                      "`operatorx db ingest` the result documents into a new --db")


def check_db(db: str, *, create: bool) -> None:
    """Everything that would make `Store(db, create=create)` fail, checked without creating or
    changing anything (for a caller that wants to know before its first case). Raises StoreError."""
    target = parse_db(db)
    if target.kind == "sqlite":
        check_sqlite_path(target, create=create, write=create)
        assert target.path is not None
        if not target.path.exists() or target.path.stat().st_size == 0:
            if not create:
                raise state_error(target, "empty", None)
            return
    existed = [f.exists() for f in _sidecars(target)]
    engine = make_engine(target, mode=_sqlite_mode(target, False), timeout_s=_busy_timeout_s())
    try:
        with engine.connect() as conn:
            state, rev = schema_state(conn)
    except DBAPIError as err:
        engine.dispose()
        failure = translate(target, err)
        _remove_new_sidecars(target, existed, failure)
        raise failure from None
    engine.dispose()
    if state == "current" or (state == "empty" and create):
        return
    raise state_error(target, state, rev)


class Store:
    """One database. `create=False` (resume) never creates one; `read_only=True` (the read commands:
    results, compare, serve, report build) never creates or writes anything, so it also reads a
    database on read-only media: SQLite opens `mode=ro` (with `immutable=1` where the directory
    cannot take the -wal/-shm), PostgreSQL sessions are READ ONLY."""

    def __init__(self, db: str, *, create: bool = True, busy_timeout_s: Optional[float] = None,
                 read_only: bool = False):
        self.target = parse_db(db)
        self.url = self.target.display()
        create = create and not read_only
        if self.target.kind == "sqlite":
            check_sqlite_path(self.target, create=create, write=create)
        self._timeout_s = _busy_timeout_s(busy_timeout_s)
        mode = "ro" if read_only else _sqlite_mode(self.target, create)
        self.engine = make_engine(self.target, mode=mode, timeout_s=self._timeout_s)
        self._case_ids: dict[str, int] = {}
        existed = [f.exists() for f in _sidecars(self.target)]
        try:
            self._open(create)
        except StoreError as err:
            self.engine.dispose()
            _remove_new_sidecars(self.target, existed, err)
            raise
        except BaseException:
            self.engine.dispose()
            raise
        # a reader's connections close (and so remove the side files its reads made, engine.py) when it
        # is closed, collected, or the interpreter exits: a read command need not close it
        self._closer = weakref.finalize(self, self.engine.dispose) if read_only else None

    def _open(self, create: bool) -> None:
        def state() -> tuple[SchemaState, Optional[str]]:
            with self.engine.connect() as conn:
                return schema_state(conn)

        found, rev = retrying(self.target, "open", state)
        if found == "current":
            return
        if found == "empty" and create:
            found, rev = retrying(self.target, "create the tables in",
                                  lambda: upgrade_to_head(self.engine, self.target, adopt_legacy=False))
            if found in ("empty", "current"):
                return
        raise state_error(self.target, found, rev)

    def close(self) -> None:
        if self._closer is not None:
            self._closer()
        else:
            self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing ---------------------------------------------------------------------------
    @contextmanager
    def _tx(self, write: bool) -> Iterator[Connection]:
        try:
            with transaction(self.engine, self.target, write=write) as conn:
                yield conn
        except BaseException:
            self._case_ids.clear()          # ids cached inside a rolled-back transaction may not exist
            raise

    def _write(self, what: str, fn: Callable[[Connection], T]) -> T:
        def attempt() -> T:
            with self._tx(write=True) as conn:
                return fn(conn)
        return retrying(self.target, what, attempt)

    def _read(self, fn: Callable[[Connection], T]) -> T:
        def attempt() -> T:
            with self._tx(write=False) as conn:
                return fn(conn)
        return retrying(self.target, "read", attempt)

    # --- a run's life -----------------------------------------------------------------------
    def begin_run(self, run_id: str, started_at: str, testlist: str, backend: str, device: str,
                  info: dict[str, Any], planned: Optional[Sequence[Row] | Plan] = None, *,
                  run_group: Optional[str] = None, shard: Optional[str] = None) -> None:
        """The run (state `running`) and its planned rows (`Row.missing(...)`, or a `Plan` of them), in
        one transaction."""
        docs = RowDocuments(planned or []) if not isinstance(planned, Plan) else planned
        identities = [r.key() for r in planned or []] if not isinstance(planned, Plan) else []

        def write(conn: Connection) -> None:
            if conn.execute(select(runs.c.id).where(runs.c.id == run_id)).first() is not None:
                raise StoreError(f"run {run_id} already exists in {self.url}: give a new run id, or resume it")
            insert_run(conn, run_id=run_id, started_at=started_at, finished_at=None, state="running",
                       testlist=testlist, backend=backend, device=device, info=info, run_group=run_group,
                       shard=shard)
            with gc_paused():              # a plan of 10^5 rows (docs/benchmarks.md, "Scale of a testlist")
                if isinstance(planned, Plan):
                    upsert_plan(conn, run_id, planned, self._case_ids)
                else:
                    upsert_rows(conn, run_id, docs, self._case_ids, identities)
        try:
            self._write("begin the run in", write)
        except StoreError:
            raise
        except IntegrityError:
            raise StoreError(f"run {run_id} already exists in {self.url}: give a new run id, or resume it") \
                from None

    def put_row(self, run_id: str, row: Row) -> None:
        """Store a case's row, replacing its planned row (or an earlier try) with the same identity."""
        self._put(run_id, [row])

    add_row = put_row                      # the name callers used before put_row

    def put_rows(self, run_id: str, rows_: list[Row]) -> None:
        """Store several rows in one transaction (all or none): what a sweep's parent does with the
        rows that finished while it was storing the last ones. One commit instead of one each keeps a
        parent fed by many GPUs (or a Ray cluster) from falling behind a database's commit time."""
        self._put(run_id, rows_)

    def _put(self, run_id: str, rows_: list[Row]) -> None:
        if not rows_:
            return
        docs = [r.to_json() for r in rows_]
        identities = [r.key() for r in rows_]
        what = "a row" if len(docs) == 1 else "rows"
        try:
            self._write(f"store {what} in", lambda conn: upsert_rows(conn, run_id, docs, self._case_ids, identities))
        except IntegrityError:
            raise RunNotFound(f"no run {run_id!r} in {self.url} to store {what} in") from None

    def unfinished(self, run_id: str) -> list[int]:
        """case_index of the run's rows still `missing`, in order."""
        q = (select(rows.c.case_index).where(rows.c.run_id == run_id, rows.c.status == "missing")
             .distinct().order_by(rows.c.case_index))
        return self._read(lambda conn: list(conn.execute(q).scalars()))

    def run_info(self, run_id: str) -> dict[str, Any]:
        info = self._read(lambda conn: conn.execute(select(runs.c.info).where(runs.c.id == run_id)).first())
        if info is None:
            raise RunNotFound(f"no run {run_id!r} in {self.url}")
        return dict(info[0] or {})

    def update_run_info(self, run_id: str, patch: dict[str, Any]) -> None:
        """Merge `patch` into the run's info (its keys replace those stored) and refresh the typed
        provenance columns from the result; `run_group` / `shard` keys also set those columns."""
        def write(conn: Connection) -> None:
            got = conn.execute(select(runs.c.info).where(runs.c.id == run_id)).first()
            if got is None:
                raise RunNotFound(f"no run {run_id!r} in {self.url}")
            info = {**(got[0] or {}), **patch}
            extra = {k: patch[k] for k in ("run_group", "shard") if k in patch}
            conn.execute(update(runs).where(runs.c.id == run_id).values(info=info, **run_values(info), **extra))
        self._write("update the run in", write)

    def finish_run(self, run_id: str, finished_at: str, state: str = "finished") -> None:
        if state not in RUN_STATES or state == "running":
            raise ValueError(f"finish_run: state {state!r} is not one of finished, interrupted, failed")
        self._set_state(run_id, state, finished_at)

    def reopen_run(self, run_id: str) -> None:
        """Back to `running` (a resume), until finish_run is called again."""
        self._set_state(run_id, "running", None)

    def _set_state(self, run_id: str, state: str, finished_at: Optional[str]) -> None:
        def write(conn: Connection) -> int:
            res = conn.execute(update(runs).where(runs.c.id == run_id).values(state=state, finished_at=finished_at))
            return int(res.rowcount)
        if self._write("update the run in", write) == 0:
            raise RunNotFound(f"no run {run_id!r} in {self.url}")

    def patch_metrics(self, run_id: str, patches: Mapping[int, Mapping[str, Any]]) -> int:
        """Merge `patches[case_index]` into the metrics of that case's row(s) of the run, all in one
        transaction (keys given replace keys stored; others stay). Returns the rows changed."""
        if not patches:
            return 0

        def write(conn: Connection) -> int:
            got = conn.execute(select(rows.c.id, rows.c.case_index, rows.c.record)
                               .where(rows.c.run_id == run_id, rows.c.case_index.in_(list(patches)))).all()
            for rid, index, record in got:
                record = dict(record)
                record["metrics"] = {**(record.get("metrics") or {}), **patches[index]}
                conn.execute(update(rows).where(rows.c.id == rid).values(**row_values(record)))
            return len(got)
        return self._write("update rows in", write)

    # --- reading ----------------------------------------------------------------------------
    def resolve_run(self, run: str) -> str:
        """A full id, a unique id prefix, or `latest`. No match, or a prefix that matches several
        runs, raises RunNotFound (listing the candidates)."""
        if run == "latest":
            q = select(runs.c.id).order_by(runs.c.started_at.desc(), runs.c.id.desc()).limit(1)
            rid = self._read(lambda conn: conn.execute(q).scalar())
            if rid is None:
                raise RunNotFound(f"no runs in {self.url} yet")
            return str(rid)
        q = select(runs.c.id).where(runs.c.id.startswith(run, autoescape=True)).order_by(runs.c.id).limit(21)
        ids = self._read(lambda conn: list(conn.execute(q).scalars()))
        if run in ids:
            return run
        if len(ids) == 1:
            return str(ids[0])
        if not ids:
            raise RunNotFound(f"no run {run!r} in {self.url} (`operatorx results list` shows the runs)")
        more = ", …" if len(ids) > 20 else ""
        raise RunNotFound(f"run {run!r} is ambiguous in {self.url}, it starts {len(ids) if not more else 'over 20'} "
                          f"runs: {', '.join(ids[:20])}{more}; give more of the id")

    def list_runs(self, limit: Optional[int] = None) -> list[dict[str, Any]]:
        """Every run (or the newest `limit`), newest first, with its row counts by status and the
        versions it ran with (torch, vllm, operatorx, git_commit; None where not recorded)."""
        cols = [runs.c.id, runs.c.started_at, runs.c.finished_at, runs.c.state, runs.c.testlist, runs.c.backend,
                runs.c.device, runs.c.gpu_name, runs.c.driver, runs.c.run_group, runs.c.shard, runs.c.kind,
                runs.c.torch_version, runs.c.vllm_version, runs.c.operatorx_version, runs.c.git_commit]

        def read(conn: Connection) -> tuple[list[Any], list[Any]]:
            q = select(*cols).order_by(runs.c.started_at.desc(), runs.c.id.desc())
            found = list(conn.execute(q if limit is None else q.limit(limit)).all())
            cq = select(rows.c.run_id, rows.c.status, func.count()).group_by(rows.c.run_id, rows.c.status)
            if limit is not None:                # count only the rows of the runs shown
                cq = cq.where(rows.c.run_id.in_([r.id for r in found]))
            return found, list(conn.execute(cq).all())
        found, counts = self._read(read)
        by_run: dict[str, dict[str, int]] = {}
        for rid, status, n in counts:
            by_run.setdefault(rid, dict.fromkeys(_STATUSES, 0))[status] = int(n)
        out = []
        for r in found:
            c = by_run.get(r.id, dict.fromkeys(_STATUSES, 0))
            out.append({"id": r.id, "started_at": r.started_at, "finished_at": r.finished_at, "state": r.state,
                        "testlist": r.testlist, "backend": r.backend, "device": r.device, "gpu": r.gpu_name,
                        "driver": r.driver, "run_group": r.run_group, "shard": r.shard, "kind": r.kind,
                        "versions": {"torch": r.torch_version, "vllm": r.vllm_version,
                                     "operatorx": r.operatorx_version, "git_commit": r.git_commit},
                        "rows": sum(c.values()), "counts": c})
        return out

    def document(self, run: str) -> dict[str, Any]:
        """The run's result document: {"schema_version", "run", "rows"}, rows in case order."""
        rid = self.resolve_run(run)

        def read(conn: Connection) -> tuple[Any, list[Any]]:
            r = conn.execute(select(runs).where(runs.c.id == rid)).first()
            records = conn.execute(select(rows.c.record).where(rows.c.run_id == rid)
                                   .order_by(rows.c.case_index, rows.c.id)).scalars().all()
            return r, list(records)
        r, records = self._read(read)
        if r is None:
            raise RunNotFound(f"no run {run!r} in {self.url}")
        fields = {k: getattr(r, k) for k in RUN_FIELDS}
        return {"schema_version": SCHEMA_VERSION, "run": {**(r.info or {}), **fields}, "rows": records}

    def rows(self, run_id: str) -> list[Row]:
        return [_row_from_json(d) for d in self.document(run_id)["rows"]]

    def row_count(self, run_id: Optional[str] = None) -> int:
        q = select(func.count()).select_from(rows)
        if run_id is not None:
            q = q.where(rows.c.run_id == run_id)
        return int(self._read(lambda conn: conn.execute(q).scalar_one()))

    def run_count(self) -> int:
        return int(self._read(lambda conn: conn.execute(select(func.count()).select_from(runs)).scalar_one()))

    def delete_run(self, run_id: str) -> bool:
        """Remove a run and its rows; False when there was none."""
        def write(conn: Connection) -> bool:
            conn.execute(delete(rows).where(rows.c.run_id == run_id))
            return bool(conn.execute(delete(runs).where(runs.c.id == run_id)).rowcount)
        return self._write("delete a run in", write)


class RowDocuments(Sequence[dict[str, Any]]):
    """Rows as their documents (`Row.to_json()`), each built when it is asked for."""

    def __init__(self, rows_: Sequence[Row]) -> None:
        self._rows = rows_

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[dict[str, Any]]: ...

    def __getitem__(self, i: int | slice) -> dict[str, Any] | Sequence[dict[str, Any]]:
        if isinstance(i, slice):
            return [r.to_json() for r in self._rows[i]]
        return self._rows[i].to_json()


def _row_from_json(d: dict[str, Any]) -> Row:
    return Row.from_json(d)
