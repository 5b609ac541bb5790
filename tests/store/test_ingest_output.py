"""`db ingest` prints what it stored, and a document's text (its file name, run id, state) reaches the
terminal without ESC, other control characters or bidi overrides: against SQLite and PostgreSQL."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from operatorx.cli import app
from operatorx.store import Store
from tests.store.conftest import done, planned

runner = CliRunner()
_TERMINAL_ACTIVE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _document(tmp_path: Path, run_id: str) -> dict:
    store = Store(str(tmp_path / "elsewhere.db"))
    store.begin_run(run_id, "2026-11-30T00:00:00", "t", "torch", "cpu", {}, planned(2))
    store.put_row(run_id, done(0))
    store.finish_run(run_id, "2026-11-30T01:00:00")
    doc = store.document(run_id)
    store.close()
    return doc


def test_ingest_prints_no_escape_sequences(tmp_path, db_url):
    run_id = "r\x1b]0;pwned\x07\x1b[2J\u202eevil"
    doc = _document(tmp_path, run_id)
    doc["run"]["state"] = "finished\x1b[31m"                         # a state that is not one: still inert
    path = tmp_path / "doc\x1b[1m\u202e.json"
    path.write_text(json.dumps(doc))
    r = runner.invoke(app, ["db", "ingest", str(path), "--db", db_url])
    assert "Traceback" not in r.output and not _TERMINAL_ACTIVE.search(r.output), repr(r.output)
    assert len(r.output.strip().splitlines()) == 1
    assert r.exit_code in (0, 2), r.output          # stored, or refused in one line (a check of the id or state)


def test_ingest_of_a_plain_document_prints_it_whole(tmp_path, db_url):
    doc = _document(tmp_path, "shard-1")
    path = tmp_path / "shard-1.json"
    path.write_text(json.dumps(doc))
    r = runner.invoke(app, ["db", "ingest", str(path), "--db", db_url])
    assert r.exit_code == 0, r.output
    assert f"{path}: run shard-1 (finished) stored, 2 rows: 1 ok, 0 unsupported, 0 error, 1 missing" in r.output


def test_a_stored_document_with_a_hostile_file_name_prints_inert(tmp_path, db_url):
    path = tmp_path / "sweep\x1b]8;;evil\x07\x1b[31m\u202eA.json"
    path.write_text(json.dumps(_document(tmp_path, "shard-2")))
    r = runner.invoke(app, ["db", "ingest", str(path), "--db", db_url])
    assert r.exit_code == 0, r.output
    assert not _TERMINAL_ACTIVE.search(r.output), repr(r.output)
    assert f"{tmp_path}/sweepA.json: run shard-2 (finished) stored, 2 rows" in r.output

