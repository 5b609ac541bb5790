"""`operatorx db ingest`: store result documents made anywhere (a CI shard, a laptop).

Ingesting a run replaces that run, whole, in one transaction: the same document twice leaves the
same rows, never twice as many. A document of a run that did not finish (a failed shard) is stored
as it is: its planned cases that never ran are rows with status `missing`; a run that still says
`running` (its process died before it could say otherwise) is stored as `interrupted`.

A document is data from anywhere. Its run id names files (documents, traces), so it must follow
the run-id rule (store/run_ids.py); a row's trace path must name that run's own trace file; a
database password an older OperatorX recorded (`job.config.db`, `env.OPERATORX_DB`) is stored in
its display form. What the run record says about its backend is stored as it is, and is never run
from here: `--resume` takes code from the command line or this machine's own runs (run/resume.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Connection, delete

from operatorx.result import Row
from operatorx.spec.testlist import validation_problem
from operatorx.store.columns import RUN_FIELDS
from operatorx.store.db import Store
from operatorx.store.errors import StoreError
from operatorx.store.redact import SECRET_ENV, hide_password
from operatorx.store.run_ids import RUN_ID_RULE, is_run_id, shown_run_id, trace_file_name
from operatorx.store.schema import rows, runs
from operatorx.store.unstored import UNSTORED_ONLY, is_journal, journal_document, merge_rows
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
    if is_journal(text):                 # rows a run could not store (store/unstored.py): added, not replacing
        return journal_document(text, str(path))
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
        except ValidationError as err:       # the field named, as a testlist's problems name it
            raise StoreError(f"{where}: rows[{i}] is not a result row ({err.title}: {validation_problem(err)}): "
                             "fix or drop that row") from None
        except Exception as err:             # any other shape the row model refuses
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
    unstored_only: bool = False
    """A journal of rows the database refused (store/unstored.py): its rows are added to the run."""


def prepare_document(doc: dict[str, Any], where: str = "document") -> PreparedDocument:
    """Check a document and bring its rows to the current form (`Row.from_json(...).to_json()`);
    raises StoreError naming the file and the part that is wrong. Stores nothing."""
    run = doc.get("run")
    if not isinstance(run, dict) or not isinstance(doc.get("rows"), list):
        raise StoreError(f"{where}: not an OperatorX result document (it needs \"run\" and \"rows\"): give a "
                         "document from operatorx-results/ or `operatorx results export`")
    run_id = run.get("id")
    if not isinstance(run_id, str) or not run_id:
        raise StoreError(f"{where}: run.id is missing or not a string: give a document OperatorX wrote")
    if not is_run_id(run_id):
        raise StoreError(f"{where}: run.id {shown_run_id(run_id)} is not a run id ({RUN_ID_RULE}; it names "
                         "files): give a document OperatorX wrote")
    for key in ("started_at", "testlist", "backend"):
        if not isinstance(run.get(key), str):
            raise StoreError(f"{where}: run.{key} is missing or not a string: give a document OperatorX wrote")
    for key in ("finished_at", "run_group", "shard"):
        if run.get(key) is not None and not isinstance(run.get(key), str):
            raise StoreError(f"{where}: run.{key} is not a string: give a document OperatorX wrote")
    state = str(run["state"]) if run.get("state") in ("finished", "interrupted", "failed") else "interrupted"
    info = _without_secrets({k: v for k, v in run.items() if k not in RUN_FIELDS})
    device = info.get("device_kind") or _dict(info.get("device")).get("kind") or "unknown"
    fields = {"started_at": run["started_at"], "finished_at": run.get("finished_at"), "state": state,
              "testlist": run["testlist"], "backend": run["backend"], "device": str(device)[:16],
              "run_group": run.get("run_group"), "shard": run.get("shard")}
    rows_ = _rows_of(doc, where)
    _check_trace_paths(rows_, run_id, where)
    return PreparedDocument(where, run_id, fields, info, rows_, unstored_only=doc.get(UNSTORED_ONLY) is True)


def _without_secrets(info: dict[str, Any]) -> dict[str, Any]:
    """The run record with any database password an older OperatorX wrote into it hidden."""
    job = _dict(info.get("job"))
    config = _dict(job.get("config"))
    if isinstance(config.get("db"), str):
        info = {**info, "job": {**job, "config": {**config, "db": hide_password(config["db"])}}}
    env = _dict(info.get("env"))
    if any(k in env for k in SECRET_ENV):
        info = {**info, "env": {k: v for k, v in env.items() if k not in SECRET_ENV}}
    return info


def _check_trace_paths(rows_: list[dict[str, Any]], run_id: str, where: str) -> None:
    """A row's `metrics.trace_path` is a path the dashboard links to: it must name this run's trace
    file of that case (`RUN-caseNNNNN.json`, the name `--trace` writes), with no `..` in it."""
    for i, d in enumerate(rows_):
        path = _dict(d.get("metrics")).get("trace_path")
        if path is None:
            continue
        expected = trace_file_name(run_id, int(d["case_index"]))
        parts = PurePath(path).parts if isinstance(path, str) else ()
        if not parts or parts[-1] != expected or ".." in parts or "\x00" in str(path):
            raise StoreError(f"{where}: rows[{i}].metrics.trace_path is not this run's trace file ({expected}): "
                             "fix or drop that row")


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def store_document(store: Store, prep: PreparedDocument) -> IngestResult:
    """Replace the run with the document's copy, whole, in one transaction (a journal of unstored
    rows: add its rows to the run)."""
    def write(conn: Connection) -> bool:
        if prep.unstored_only:                     # added to the run: nothing replaced
            merge_rows(conn, prep.run_id, prep.fields, prep.info, prep.rows, store._case_ids)
            return False
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
