"""The statements that write runs and rows, shared by the Store, ingest and the legacy upgrade.

Rows are upserted on their identity (run, case, backend, side): a second write of the same row
replaces the first, in SQLite and PostgreSQL alike (`INSERT ... ON CONFLICT DO UPDATE`), so two
processes writing one row at once still leave one row.

Everything written here is storable (operatorx/storable.py): text columns have their lone
surrogates and NUL replaced, JSON is serialized without them, and an integer column given a value
past 64 bits gets NULL (columns.py), so one odd value never fails the write of a run's rows.

On SQLite, where a JSON column is text, the many-row statements are run through the driver: JSON
serialized here, parameters bound by position, the SQL text SQLAlchemy compiled for the statement
(once). SQLAlchemy's per-value processing was most of the time of storing a 10^5-case plan
(docs/benchmarks.md, "Scale of a testlist"); the stored text is the same.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from typing import Any, Optional

from sqlalchemy import JSON, Connection, Table, select
from sqlalchemy.dialects import postgresql, sqlite

from operatorx.result import Plan
from operatorx.storable import storable, storable_data, storable_json
from operatorx.store.columns import (
    NONE_SHOWN,
    case_key_of,
    case_values,
    int64_or_none,
    key_sha256,
    model_role,
    row_values,
    run_values,
)
from operatorx.store.schema import cases, rows, runs

__all__ = ["insert_run", "upsert_rows", "upsert_plan", "json_dumps"]

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
    """Strict, storable JSON for the JSON columns: non-finite numbers become null (PostgreSQL refuses
    NaN), lone surrogates and NUL in strings U+FFFD (`jsonb` refuses their escapes)."""
    if value is None:
        return "null"
    try:
        text = _encode(value)
    except ValueError:
        value = _finite(value)
        text = _encode(value)
    return storable_json(text, value)


def _encoder() -> Callable[[Any], str]:
    """`json.dumps(value, allow_nan=False, default=str)` with its C encoder made once (json.dumps makes
    one a call: a quarter of the time of a planned row's document) and no check for reference
    cycles (column values are JSON data, built from rows)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:                                  # a Python without the C accelerator
        return json.JSONEncoder(allow_nan=False, default=str).encode
    encode = make(None, str, json.encoder.encode_basestring_ascii, None, ": ", ", ", False, False, False)
    return lambda value: "".join(encode(value, 0))


_encode = _encoder()


_JSON_COLUMNS = {t.name: frozenset(c.name for c in t.columns if isinstance(c.type, JSON)) for t in (cases, rows)}
_DRIVER_SQL: dict[tuple[str, str], tuple[str, list[str]]] = {}


def _execute_many(conn: Connection, what: str, stmt: Any, table: Table, values: list[dict[str, Any]],
                  serialized: bool = False) -> None:
    """Run `stmt` once per value dict (every dict with the same keys). On SQLite through the driver
    (`what` names the statement's compiled SQL, kept per dialect), JSON columns serialized here as
    SQLAlchemy's JSON type would (None as JSON null), or already (`serialized`, SQLite only);
    elsewhere through SQLAlchemy."""
    if not values:
        return
    if conn.dialect.name != "sqlite":
        conn.execute(stmt, values)
        return
    text, names = _driver_sql(conn, what, stmt, list(values[0]))
    plain = operator.itemgetter(*names)
    if serialized:
        conn.exec_driver_sql(text, [plain(v) for v in values])
        return
    json_columns = _JSON_COLUMNS[table.name]
    json_at = [i for i, n in enumerate(names) if n in json_columns]
    params: list[tuple[Any, ...]] = []
    for v in values:
        row = list(plain(v))
        for i in json_at:
            row[i] = json_dumps(row[i])
        params.append(tuple(row))
    conn.exec_driver_sql(text, params)


def _driver_sql(conn: Connection, what: str, stmt: Any, keys: list[str]) -> tuple[str, list[str]]:
    """(the SQL text SQLAlchemy compiles `stmt` to for these value keys, the keys in parameter order),
    compiled once per `what` and dialect."""
    compiled = _DRIVER_SQL.get((what, conn.dialect.name))
    if compiled is None:
        sql = stmt.compile(dialect=conn.dialect, column_keys=keys)
        compiled = (str(sql), list(sql.positiontup or ()))
        _DRIVER_SQL[(what, conn.dialect.name)] = compiled
    return compiled


def _insert(conn: Connection, table: Any) -> Any:
    mod = postgresql if conn.dialect.name == "postgresql" else sqlite
    return mod.insert(table)


def insert_run(conn: Connection, *, run_id: str, started_at: str, finished_at: Optional[str], state: str,
               testlist: str, backend: str, device: str, info: dict[str, Any], run_group: Optional[str],
               shard: Optional[str]) -> None:
    """The run's record; its text made storable (a testlist path that is not UTF-8, a device name)."""
    info = storable_data(info)

    def text(v: Optional[str]) -> Optional[str]:
        return None if v is None else storable(v)

    conn.execute(runs.insert().values(
        id=run_id, started_at=started_at, finished_at=finished_at, state=state, testlist=storable(testlist),
        backend=storable(backend), device=storable(device), run_group=text(run_group), shard=text(shard),
        info=info, **run_values(info)))


def _case_ids(conn: Connection, docs: Sequence[dict[str, Any]], keys: Sequence[str],
              cache: MutableMapping[str, int]) -> list[int]:
    """The `cases` id of each row document's case (`keys`: their case keys), adding cases not stored
    yet, in key-hash order."""
    return _ids_of(conn, [case_values(d, k) for d, k in zip(docs, keys, strict=True)], cache)


def _ids_of(conn: Connection, values: list[dict[str, Any]], cache: MutableMapping[str, int],
            serialized: bool = False) -> list[int]:
    """The `cases` id of each `cases` row in `values`, inserting those not stored yet (in key-hash
    order); `serialized`: their JSON columns are text already."""
    ids = {v["key_sha256"]: cache.get(v["key_sha256"]) for v in values}       # the cache may be shared by threads
    new = sorted({v["key_sha256"]: v for v in values if ids[v["key_sha256"]] is None}.items())
    if new:
        stmt = _insert(conn, cases).on_conflict_do_nothing(index_elements=["key_sha256"])
        todo = [v for _, v in new]
        what = "cases insert, serialized" if serialized else "cases insert"
        for i in range(0, len(todo), _CHUNK):
            _execute_many(conn, what, stmt, cases, todo[i:i + _CHUNK], serialized)
        shas = [k for k, _ in new]
        for i in range(0, len(shas), _CHUNK):
            got = {str(k): int(cid) for k, cid in conn.execute(
                select(cases.c.key_sha256, cases.c.id).where(cases.c.key_sha256.in_(shas[i:i + _CHUNK]))).all()}
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


def upsert_rows(conn: Connection, run_id: str, docs: Sequence[dict[str, Any]],
                cache: Optional[MutableMapping[str, int]] = None,
                identities: Optional[Sequence[tuple[str, str, str]]] = None) -> int:
    """Store row documents of one run, each replacing any row with its identity (case key, backend,
    side). A batch holding one identity twice keeps the last. Returns the rows written.

    `identities`, when the caller has them (`Row.key()`), spare reading each document twice: then
    `docs` may build each document when it is asked for (a run's plan of 10^5 rows is never held as
    documents all at once), and each is asked for once.

    Rows go in chunks of _CHUNK, in the order of (SHA-256 of the case key, backend, side): the same
    order in every writer, so two transactions storing overlapping cases and rows take their locks
    in the same order (no deadlock), and a chunk's new cases go in before its rows.
    """
    if not docs:
        return 0
    cache = {} if cache is None else cache
    if identities is None:
        identities = [(case_key_of(d), storable(d["op"]["backend"]), storable(d.get("side") or "")) for d in docs]
    last: dict[tuple[str, str, str], int] = {}
    for position, identity in enumerate(identities):
        last[identity] = position
    order = sorted(last, key=lambda i: (key_sha256(i[0]), i[1], i[2]))
    with _bulk_cache(conn, len(order)):
        _upsert_chunks(conn, run_id, docs, order, last, cache)
    return len(order)


_BULK_ROWS = 200_000
#: SQLite's page cache while it takes a bulk write, in KiB: the rows' case-index index takes them in
#: hash order, so each insert lands on a random page; in the default 2 MiB cache a plan of 10^6 rows
#: spent 6 s more on them (docs/benchmarks.md, "Scale of a testlist"). Pages are only held as used.
_BULK_CACHE_KIB = 256 << 10


@contextmanager
def _bulk_cache(conn: Connection, rows_: int) -> Iterator[None]:
    """A larger SQLite page cache for a write of many rows, the connection's own back after it."""
    if conn.dialect.name != "sqlite" or rows_ < _BULK_ROWS:
        yield
        return
    before = int(conn.exec_driver_sql("PRAGMA cache_size").scalar() or -2000)
    conn.exec_driver_sql(f"PRAGMA cache_size=-{_BULK_CACHE_KIB}")
    try:
        yield
    finally:
        conn.exec_driver_sql(f"PRAGMA cache_size={before}")


def _upsert_chunks(conn: Connection, run_id: str, docs: Sequence[dict[str, Any]], order: list[tuple[str, str, str]],
                   last: dict[tuple[str, str, str], int], cache: MutableMapping[str, int]) -> None:
    for start in range(0, len(order), _CHUNK):
        chunk = order[start:start + _CHUNK]
        chunk_docs = [docs[last[i]] for i in chunk]
        ids = _case_ids(conn, chunk_docs, [i[0] for i in chunk], cache)
        values = []
        for cid, d in zip(ids, chunk_docs, strict=True):
            v = row_values(d)
            v["run_id"], v["case_id"] = run_id, cid
            values.append(v)
        _execute_many(conn, "rows upsert", _row_upsert(conn), rows, values)


def upsert_plan(conn: Connection, run_id: str, plan: Plan, cache: Optional[MutableMapping[str, int]] = None) -> int:
    """Store a run's plan: one `missing` row per planned case, as `upsert_rows` would store
    `Row.missing(...)` for each (the same rows, columns and document text; a test compares them).

    On SQLite each row's columns are built straight from its case: the document's text composed from
    the case's args and sources encoded once, which they share with the `cases` row, instead of a
    document built, read back into columns and encoded whole (three quarters of the Python time of
    storing 10^5 planned rows; docs/benchmarks.md, "Scale of a testlist"). Elsewhere: `upsert_rows`.
    """
    identities = plan.identities()
    cache = {} if cache is None else cache
    if conn.dialect.name != "sqlite":
        return upsert_rows(conn, run_id, plan, cache, identities)
    last = {identity: position for position, identity in enumerate(identities)}
    fixed = {"backend": storable(plan.backend), "side": storable(plan.side), "testlist": storable(plan.testlist)}
    encoded = {name: _encode(value) for name, value in fixed.items()}
    same = {**fixed, "status": "missing", "error_kind": None, "message": None, "scheme": None, **NONE_SHOWN,
            "samples_us": "null", "run_id": run_id}            # what every planned row holds
    varying = ("case_index", "op_type", "label", "model", "role", "m", "n", "k", "tokens", "sources", "record",
               "case_id")
    text, names = _driver_sql(conn, "rows upsert, planned", _row_upsert(conn), [*same, *varying])
    template = [same.get(name) for name in names]
    at = [names.index(name) for name in varying]
    # In file order, what each row needs of its case (reading 10^6 cases in hash order, scattered over
    # the heap, cost more); then stored in the writers' one order (see upsert_rows).
    prepared = []
    for identity, position in last.items():
        index, case = plan.chosen[position]
        args = case.args_dict()
        model, role = model_role(case.sources)
        prepared.append((key_sha256(identity[0]), identity[1], identity[2], identity[0], int(index), case.type,
                         case.label(), _encode(args), _encode(list(case.sources)), model, role,
                         int64_or_none(args.get("m")), int64_or_none(args.get("n")), int64_or_none(args.get("k")),
                         int64_or_none(args.get("tokens"))))
    prepared.sort()
    backend, testlist, side = encoded["backend"], encoded["testlist"], encoded["side"]
    with _bulk_cache(conn, len(prepared)):
        for start in range(0, len(prepared), _CHUNK):
            chunk = prepared[start:start + _CHUNK]
            case_rows = [{"key_sha256": p[0], "case_key": p[3], "type": p[5], "label": p[6], "args": p[7],
                          "sources": p[8]} for p in chunk]
            ids = _ids_of(conn, case_rows, cache, serialized=True)
            params = []
            for (_, _, _, _, index, op_type, label, args_json, sources_json, model, role, m, n, k, tokens), cid \
                    in zip(chunk, ids, strict=True):
                record = (f'{{"op": {{"type": {_encode(op_type)}, "args": {args_json}, "backend": {backend}, '
                          f'"sources": {sources_json}}}, "label": {_encode(label)}, "status": "missing", '
                          f'"testlist": {testlist}, "case_index": {index}, "side": {side}, "error_kind": null, '
                          '"metrics": {}}')
                row = template.copy()
                for i, value in zip(at, (index, op_type, label, model, role, m, n, k, tokens, sources_json, record,
                                         cid), strict=True):
                    row[i] = value
                params.append(tuple(row))
            conn.exec_driver_sql(text, params)
    return len(prepared)
