"""`operatorx db ingest`: store result documents made anywhere (a CI shard, a laptop).

Ingesting a run replaces that run, whole, in one transaction: the same document twice leaves the
same rows, never twice as many. A document of a run that did not finish (a failed shard) is stored
as it is: its planned cases that never ran are rows with status `missing`; a run that still says
`running` (its process died before it could say otherwise) is stored as `interrupted`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, delete

from operatorx.result import Row
from operatorx.store.columns import RUN_FIELDS
from operatorx.store.db import Store
from operatorx.store.errors import StoreError
from operatorx.store.schema import rows, runs
from operatorx.store.writes import insert_run, upsert_rows

__all__ = ["ingest_document", "ingest_file", "IngestResult", "read_document", "prepare_document", "store_document",
           "PreparedDocument"]


class IngestResult(dict[str, Any]):
    """{"run_id", "rows", "replaced", "state", "counts"}"""


def read_document(path: Path) -> dict[str, Any]:
    def no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StoreError(f"{path}: no such file: give the path of a result document (operatorx-results/*.json)") \
            from None
    except (OSError, UnicodeDecodeError) as err:
        raise StoreError(f"{path}: cannot read it ({err}): give a result document written by OperatorX") from None
    try:
        doc = json.loads(text, parse_constant=no_constants)
    except ValueError as err:
        raise StoreError(f"{path}: not valid JSON ({err}): give a result document written by OperatorX") from None
    return doc if isinstance(doc, dict) else {"_not_an_object": doc}


def _rows_of(doc: dict[str, Any], where: str) -> list[dict[str, Any]]:
    out = []
    for i, d in enumerate(doc["rows"]):
        try:
            out.append(Row.from_json(d).to_json())
        except Exception as err:             # any shape the row model refuses
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise StoreError(f"{where}: rows[{i}] is not a result row ({first}): fix or drop that row") from None
    return out


@dataclass(frozen=True)
class PreparedDocument:
    """A document checked and put in the current row form, ready to store."""
    where: str
    run_id: str
    fields: dict[str, Any]
    info: dict[str, Any]
    rows: list[dict[str, Any]]


def prepare_document(doc: dict[str, Any], where: str = "document") -> PreparedDocument:
    """Check a document and bring its rows to the current form (`Row.from_json(...).to_json()`);
    raises StoreError naming the file and the part that is wrong. Stores nothing."""
    run = doc.get("run")
    if not isinstance(run, dict) or not isinstance(doc.get("rows"), list):
        raise StoreError(f"{where}: not an OperatorX result document (it needs \"run\" and \"rows\"): give a "
                         "document from operatorx-results/ or `operatorx results export`")
    run_id = run.get("id")
    if not isinstance(run_id, str) or not run_id or len(run_id) > 64:
        raise StoreError(f"{where}: run.id is missing or not a short string: give a document OperatorX wrote")
    for key in ("started_at", "testlist", "backend"):
        if not isinstance(run.get(key), str):
            raise StoreError(f"{where}: run.{key} is missing or not a string: give a document OperatorX wrote")
    for key in ("finished_at", "run_group", "shard"):
        if run.get(key) is not None and not isinstance(run.get(key), str):
            raise StoreError(f"{where}: run.{key} is not a string: give a document OperatorX wrote")
    state = str(run["state"]) if run.get("state") in ("finished", "interrupted", "failed") else "interrupted"
    info = {k: v for k, v in run.items() if k not in RUN_FIELDS}
    device = info.get("device_kind") or _dict(info.get("device")).get("kind") or "unknown"
    fields = {"started_at": run["started_at"], "finished_at": run.get("finished_at"), "state": state,
              "testlist": run["testlist"], "backend": run["backend"], "device": str(device)[:16],
              "run_group": run.get("run_group"), "shard": run.get("shard")}
    return PreparedDocument(where, run_id, fields, info, _rows_of(doc, where))


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def store_document(store: Store, prep: PreparedDocument) -> IngestResult:
    """Replace the run with the document's copy, whole, in one transaction."""
    def write(conn: Connection) -> bool:
        conn.execute(delete(rows).where(rows.c.run_id == prep.run_id))
        replaced = bool(conn.execute(delete(runs).where(runs.c.id == prep.run_id)).rowcount)
        insert_run(conn, run_id=prep.run_id, info=prep.info, **prep.fields)
        upsert_rows(conn, prep.run_id, prep.rows, store._case_ids)
        return replaced

    replaced = store._write("ingest into", write)
    kept = {(d["op"]["type"], json.dumps(d["op"]["args"], sort_keys=True), d["op"]["backend"], d.get("side") or ""):
            d["status"] for d in prep.rows}                # one per identity, as stored
    counts = dict.fromkeys(("ok", "unsupported", "error", "missing"), 0)
    for status in kept.values():
        counts[status] = counts.get(status, 0) + 1
    return IngestResult(run_id=prep.run_id, rows=len(kept), replaced=replaced, state=prep.fields["state"],
                        counts=counts)


def ingest_document(store: Store, doc: dict[str, Any], where: str = "document") -> IngestResult:
    return store_document(store, prepare_document(doc, where))


def ingest_file(store: Store, path: Path) -> IngestResult:
    return ingest_document(store, read_document(path), str(path))
