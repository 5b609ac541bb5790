"""The statements that write runs and rows, shared by the Store, ingest and the legacy upgrade.

Rows are upserted on their identity (run, case, backend, side): a second write of the same row
replaces the first, in SQLite and PostgreSQL alike (`INSERT ... ON CONFLICT DO UPDATE`), so two
processes writing one row at once still leave one row.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, MutableMapping
from typing import Any, Optional

from sqlalchemy import Connection, select
from sqlalchemy.dialects import postgresql, sqlite

from operatorx.store.columns import case_values, row_values, run_values
from operatorx.store.schema import cases, rows, runs

__all__ = ["insert_run", "upsert_rows", "json_dumps"]

_CHUNK = 500


def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def json_dumps(value: Any) -> str:
    """Strict JSON for the JSON columns (PostgreSQL refuses NaN): non-finite numbers become null."""
    try:
        return json.dumps(value, allow_nan=False, default=str)
    except ValueError:
        return json.dumps(_finite(value), allow_nan=False, default=str)


def _insert(conn: Connection, table: Any) -> Any:
    mod = postgresql if conn.dialect.name == "postgresql" else sqlite
    return mod.insert(table)


def insert_run(conn: Connection, *, run_id: str, started_at: str, finished_at: Optional[str], state: str,
               testlist: str, backend: str, device: str, info: dict[str, Any], run_group: Optional[str],
               shard: Optional[str]) -> None:
    conn.execute(runs.insert().values(
        id=run_id, started_at=started_at, finished_at=finished_at, state=state, testlist=testlist,
        backend=backend, device=device, run_group=run_group, shard=shard, info=info, **run_values(info)))


def _case_ids(conn: Connection, docs: Iterable[dict[str, Any]], cache: MutableMapping[str, int]) -> list[int]:
    """The `cases` id of each row document's case, adding cases not stored yet. New cases go in key
    order, so two transactions adding overlapping cases lock them in the same order (no deadlock)."""
    values = [case_values(d) for d in docs]
    ids = {v["key_sha256"]: cache.get(v["key_sha256"]) for v in values}       # the cache may be shared by threads
    new = sorted({v["key_sha256"]: v for v in values if ids[v["key_sha256"]] is None}.items())
    if new:
        stmt = _insert(conn, cases).on_conflict_do_nothing(index_elements=["key_sha256"])
        todo = [v for _, v in new]
        for i in range(0, len(todo), _CHUNK):
            conn.execute(stmt, todo[i:i + _CHUNK])
        keys = [k for k, _ in new]
        for i in range(0, len(keys), _CHUNK):
            got = {str(k): int(cid) for k, cid in conn.execute(
                select(cases.c.key_sha256, cases.c.id).where(cases.c.key_sha256.in_(keys[i:i + _CHUNK])))}
            ids.update(got)
            cache.update(got)
    return [int(ids[v["key_sha256"]] or 0) for v in values]


_ROW_UPDATE = [c.name for c in rows.columns if c.name not in ("id", "run_id", "case_id", "backend", "side")]
_ROW_UPSERT: dict[str, Any] = {}


def _row_upsert(conn: Connection) -> Any:
    """The rows upsert statement for the connection's dialect, built once: building it (its `excluded`
    columns) cost ~1 ms a row, in the parent thread that also hands the next case to each worker."""
    stmt = _ROW_UPSERT.get(conn.dialect.name)
    if stmt is None:
        base = _insert(conn, rows)
        stmt = base.on_conflict_do_update(index_elements=["run_id", "case_id", "backend", "side"],
                                          set_={c: base.excluded[c] for c in _ROW_UPDATE})
        _ROW_UPSERT[conn.dialect.name] = stmt
    return stmt


def upsert_rows(conn: Connection, run_id: str, docs: list[dict[str, Any]],
                cache: Optional[MutableMapping[str, int]] = None) -> int:
    """Store row documents of one run, each replacing any row with its identity. A batch holding
    one identity twice keeps the last. Returns the rows written."""
    if not docs:
        return 0
    ids = _case_ids(conn, docs, {} if cache is None else cache)
    batch: dict[tuple[int, str, str], dict[str, Any]] = {}
    for cid, d in zip(ids, docs, strict=True):
        v = {"run_id": run_id, "case_id": cid, **row_values(d)}
        batch[(cid, v["backend"], v["side"])] = v
    stmt = _row_upsert(conn)
    todo = [batch[k] for k in sorted(batch)]           # one lock order for every writer
    for i in range(0, len(todo), _CHUNK):
        conn.execute(stmt, todo[i:i + _CHUNK])
    return len(todo)
