"""`operatorx db ingest`: the same document twice is the same rows; failed shards are stored with
their unrun cases `missing`; a bad document stores nothing."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from operatorx.cli import app
from operatorx.store import Store, StoreError, write_json_atomic
from operatorx.store.ingest import ingest_document, ingest_file
from tests.store.conftest import done, planned

runner = CliRunner()
_made = itertools.count()


def _document(tmp_path: Path, run_id: str = "shard-1", n: int = 6, finished: int = 4,
              state: str = "finished") -> dict:
    """A document as a run elsewhere wrote it: n planned cases, the first `finished` ended."""
    store = Store(str(tmp_path / f"elsewhere-{next(_made)}.db"))
    store.begin_run(run_id, "2026-11-30T00:00:00", "t", "torch", "cuda",
                    {"device": {"kind": "cuda", "name": "NVIDIA H200", "uuid": "GPU-9"}, "host": "node7",
                     "software": {"torch": "2.13", "vllm": "0.27"}}, planned(n), run_group="g", shard="1/2")
    for i in range(finished):
        store.put_row(run_id, done(i, latency_us=10.0 + i, status="ok" if i else "error"))
    if state != "running":
        store.finish_run(run_id, "2026-11-30T01:00:00", state)
    doc = store.document(run_id)
    store.close()
    return doc


def test_ingest_twice_is_the_same_rows(tmp_path, db_url):
    doc = _document(tmp_path)
    store = Store(db_url)
    first = ingest_document(store, doc)
    assert first["replaced"] is False and first["rows"] == 6
    before = store.document("shard-1")
    second = ingest_document(store, json.loads(json.dumps(doc)))
    assert second["replaced"] is True
    after = store.document("shard-1")
    assert after == before and store.row_count() == 6
    assert before["rows"] == doc["rows"]                     # rows come back as they went in
    assert json.dumps(before["rows"]) == json.dumps(doc["rows"])             # key order too
    run = store.list_runs()[0]
    assert (run["gpu"], run["run_group"], run["shard"], run["state"]) == ("NVIDIA H200", "g", "1/2", "finished")
    assert run["counts"] == {"ok": 3, "unsupported": 0, "error": 1, "missing": 2}


def test_a_failed_shard_is_stored_with_its_unrun_cases_missing(tmp_path, db_url):
    store = Store(db_url)
    got = ingest_document(store, _document(tmp_path, "dead", n=5, finished=2, state="failed"))
    assert got["state"] == "failed" and got["counts"]["missing"] == 3
    assert store.unfinished("dead") == [2, 3, 4]
    # a shard killed before it could say so still reads `running` in its document: stored as interrupted
    got = ingest_document(store, _document(tmp_path, "killed", n=3, finished=1, state="running"))
    assert got["state"] == "interrupted" and store.document("killed")["run"]["state"] == "interrupted"


def test_a_newer_copy_replaces_the_old_one_whole(tmp_path, db_url):
    store = Store(db_url)
    ingest_document(store, _document(tmp_path, "r", n=4, finished=1, state="interrupted"))
    ingest_document(store, _document(tmp_path, "r", n=2, finished=2))
    assert store.row_count("r") == 2 and store.unfinished("r") == []


def test_a_failure_half_way_leaves_the_stored_run_as_it_was(tmp_path, db_url, monkeypatch):
    from operatorx.store import ingest

    store = Store(db_url)
    ingest_document(store, _document(tmp_path, "r", n=3, finished=3))
    before = store.document("r")

    def broken(*a: object, **k: object) -> int:
        raise RuntimeError("disk gone")

    monkeypatch.setattr(ingest, "upsert_rows", broken)
    with pytest.raises(RuntimeError):
        ingest_document(store, _document(tmp_path, "r", n=1, finished=0))
    assert store.document("r") == before


def test_cli_ingest_stores_every_file_or_none(tmp_path):
    good = tmp_path / "good.json"
    write_json_atomic(_document(tmp_path, "a"), good)
    bad = tmp_path / "bad.json"
    doc = _document(tmp_path, "b")
    doc["rows"][1]["status"] = "great"
    write_json_atomic(doc, bad)
    db = str(tmp_path / "team.db")
    r = runner.invoke(app, ["db", "ingest", str(good), str(bad), "--db", db])
    assert r.exit_code == 2 and "rows[1]" in r.output and str(bad) in r.output, r.output
    assert not Path(db).exists()                         # checked before the database was opened
    r = runner.invoke(app, ["db", "ingest", str(good), "--db", db])
    assert r.exit_code == 0 and "run a (finished) stored, 6 rows: 3 ok" in r.output, r.output
    r = runner.invoke(app, ["db", "ingest", str(good), "--db", db])
    assert r.exit_code == 0 and "replaced" in r.output
    assert Store(db).row_count() == 6


@pytest.mark.parametrize("content,words", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "not an OperatorX result document"),
    ('{"run": {"id": 5}, "rows": []}', "run.id"),
    ('{"run": {"id": "x", "started_at": "t", "testlist": "t", "backend": "b"}, "rows": [NaN]}', "not valid JSON"),
])
def test_bad_documents(tmp_path, content, words):
    path = tmp_path / "doc.json"
    path.write_text(content)
    with pytest.raises(StoreError, match=words):
        ingest_file(Store(str(tmp_path / "ox.db")), path)
    r = runner.invoke(app, ["db", "ingest", str(path), "--db", str(tmp_path / "other.db")])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and words in r.output
    r = runner.invoke(app, ["db", "ingest", str(tmp_path / "nope.json"), "--db", str(tmp_path / "other.db")])
    assert r.exit_code == 2 and "no such file" in r.output
    assert not (tmp_path / "other.db").exists()
