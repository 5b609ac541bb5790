"""Rows the database could not store, kept in a file the moment the store refuses them.

A full disk (or a quota, a per-file size limit, an unreachable server) can refuse a row, then the
run's final update, then the result document: before this file existed all three failed together
and every measured row was lost, with the run left `running`. So a refused row is appended, at
once, to a journal beside the result document, `RESULTS_DIR/RUN.unstored.jsonl`; when that cannot
be written, every row kept so far goes to a new journal in the system's temporary directory, and
only when that fails too are they held in memory alone (and the run says they are).

The journal is JSON lines: a header (the run's record), one line per row, and a closing line (the
state the run ended in) when the run got that far. A line cut short by the full disk is skipped on
reading. `operatorx db ingest JOURNAL` adds its rows to the run, replacing the run's `missing` rows
of those cases, and creates the run from the header in a database that has none; unlike a result
document it never replaces the whole run, because it holds only the rows the store refused.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from sqlalchemy import select, update

from operatorx.store.columns import RUN_FIELDS
from operatorx.store.errors import StoreError

__all__ = ["JOURNAL_KIND", "UNSTORED_ONLY", "UnstoredRows", "run_record", "is_journal", "journal_document",
           "merge_rows"]

JOURNAL_KIND = "operatorx-unstored-rows"
"""The header's `kind`: what tells a journal from a result document."""
UNSTORED_ONLY = "unstored_rows_only"
"""The key a journal read as a document carries: its rows are added to the run, never replace it."""

_SUFFIX = ".unstored.jsonl"


def _line(record: dict[str, Any]) -> bytes:
    # ASCII JSON: a lone surrogate in a message is written as its escape, never refused
    return (json.dumps(record, default=str, separators=(",", ":")) + "\n").encode("ascii")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class UnstoredRows:
    """The rows of one run that the store refused, each written to a journal as it is refused.

    `path` is the journal that holds every row kept so far (None while there is none, or when no
    location could take them)."""

    def __init__(self, run_id: str, results_dir: Path, header: dict[str, Any]) -> None:
        self.run_id, self.results_dir, self.header = run_id, results_dir, header
        self.rows: dict[Any, dict[str, Any]] = {}
        self.path: Optional[Path] = None
        self.error: Optional[str] = None
        """Why the last location refused the journal (a strerror)."""
        self._fd: Optional[int] = None
        self._earlier = False
        """The rows file held lines of an earlier try of this run when this one first wrote to it."""
        self._tried: list[str] = []          # locations that refused it, in order: results dir, temp dir

    def add(self, key: Any, doc: dict[str, Any]) -> Optional[str]:
        """Keep `doc` (a row's document, identity `key`); a line to show when the journal had to
        leave the results directory or could not be written at all, else None."""
        self.rows[key] = doc
        if self._fd is not None:
            try:
                _write_all(self._fd, _line({"row": doc}))
                return None
            except OSError as err:
                self._drop_fd()
                self.error = err.strerror or str(err)
        return self._relocate()

    def _open(self, where: str) -> tuple[int, Path]:
        if where == "results":
            self.results_dir.mkdir(parents=True, exist_ok=True)
            path = self.results_dir / f"{self.run_id}{_SUFFIX}"
            # appended to, never truncated: a journal an earlier try of this run left is kept
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._earlier = os.fstat(fd).st_size > 0
            return fd, path
        fd, name = tempfile.mkstemp(prefix=f"operatorx-{self.run_id}-", suffix=_SUFFIX)
        self._earlier = False
        return fd, Path(name)

    def _relocate(self) -> Optional[str]:
        """Write the header and every row kept to the next location that takes them."""
        old = self.path
        for where in ("results", "temp"):
            if where in self._tried:
                continue
            try:
                fd, path = self._open(where)
            except OSError as err:
                self._tried.append(where)
                self.error = err.strerror or str(err)
                continue
            try:
                _write_all(fd, _line({"kind": JOURNAL_KIND, "version": 1, "run": self.header}))
                for doc in self.rows.values():
                    _write_all(fd, _line({"row": doc}))
            except OSError as err:
                os.close(fd)
                self._tried.append(where)
                self.error = err.strerror or str(err)
                continue
            self._fd, self.path = fd, path
            if old is None and where == "results":
                return None                  # where it always goes: the caller's line names it
            return (f"{old or 'the results directory'} could not take more rows ({self.error}): every row the "
                    f"database could not store is now kept in {path}")
        self.path = None
        return (f"{len(self.rows)} row(s) the database could not store could not be written to a file either "
                f"({self.error}): they are held in memory until the run ends")

    def close(self, state: str, finished_at: Optional[str]) -> None:
        """Record the state the run ended in (what `db ingest` stores when the database could not)."""
        if self._fd is None:
            return
        try:
            _write_all(self._fd, _line({"closed": {"state": state, "finished_at": finished_at}}))
        except OSError as err:
            self.error = err.strerror or str(err)
        self._drop_fd()

    def discard(self) -> None:
        """The result document holds every row of this try: its journal is not needed (one that
        also holds an earlier try's lines is left where it is: those rows may be in no document)."""
        self._drop_fd()
        if self.path is not None and not self._earlier:
            self.path.unlink(missing_ok=True)
        self.path = None

    def _drop_fd(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None


def run_record(read: Callable[[Callable[[Any], Any]], Any], run_id: str) -> Optional[dict[str, Any]]:
    """The run's record as its document has it (info and typed fields, no rows), read with a
    store's `_read`; None when there is no such run."""
    from operatorx.store.schema import runs

    r = read(lambda conn: conn.execute(select(runs).where(runs.c.id == run_id)).first())
    if r is None:
        return None
    return {**(r.info or {}), **{k: getattr(r, k) for k in RUN_FIELDS}}


def is_journal(text: str) -> bool:
    """Whether `text` is a journal (its first line a journal header)."""
    first = text.split("\n", 1)[0]
    if JOURNAL_KIND not in first:
        return False
    try:
        head = json.loads(first)
    except ValueError:
        return False
    return isinstance(head, dict) and head.get("kind") == JOURNAL_KIND


def journal_document(text: str, where: str) -> dict[str, Any]:
    """A journal as a result document marked `UNSTORED_ONLY`: the header's run (with the state of
    its last closing line; `running` when there is none) and every complete row line, a later line
    for the same case replacing an earlier one on storing. Lines cut short are skipped."""
    run: Optional[dict[str, Any]] = None
    docs: list[dict[str, Any]] = []
    closed: dict[str, Any] = {}
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue                                   # cut short by the full disk
        if not isinstance(record, dict):
            continue
        if record.get("kind") == JOURNAL_KIND and run is None and isinstance(record.get("run"), dict):
            run = record["run"]
        elif isinstance(record.get("row"), dict):
            docs.append(record["row"])
        elif isinstance(record.get("closed"), dict):
            closed = record["closed"]
    if run is None:
        raise StoreError(f"{where}: a journal of unstored rows without its header line: give the file a run wrote")
    state = closed.get("state") if isinstance(closed.get("state"), str) else "running"
    return {"run": {**run, "state": state, "finished_at": closed.get("finished_at", run.get("finished_at"))},
            "rows": docs, UNSTORED_ONLY: True}


def merge_rows(conn: Any, run_id: str, fields: dict[str, Any], info: dict[str, Any], docs: list[dict[str, Any]],
               cache: Any) -> bool:
    """Add a journal's rows to the run (each replacing the row of its case), creating the run when
    the database has none. A run still `running` takes the journal's state (its closing line's, or
    `interrupted`: the run's process could not say). Returns whether the run was there."""
    from operatorx.store.schema import runs
    from operatorx.store.writes import insert_run, upsert_rows

    got = conn.execute(select(runs.c.state).where(runs.c.id == run_id)).first()
    if got is None:
        insert_run(conn, run_id=run_id, info=info, **fields)
    elif got[0] == "running":
        conn.execute(update(runs).where(runs.c.id == run_id)
                     .values(state=fields["state"], finished_at=fields.get("finished_at")))
    upsert_rows(conn, run_id, docs, cache)
    return got is not None
