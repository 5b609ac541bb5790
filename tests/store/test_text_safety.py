"""Text no store can encode (lone surrogates, NUL) never fails a run: it is stored with U+FFFD in its place.

A backend's OSError about a file name that is not UTF-8 carries lone surrogates; before, the row
write raised UnicodeEncodeError in SQLite's and psycopg's drivers alike, the run ended `failed` with
the rest `missing`, and every `--resume` died the same way.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest

from operatorx.backends import Check, Prepared, register_backend
from operatorx.measure import TimingSettings
from operatorx.result import Row
from operatorx.run import RunConfig, run_testlist
from operatorx.spec import Case
from operatorx.storable import MESSAGE_MAX_CHARS, REPLACEMENT, TEXT_MAX_CHARS
from operatorx.store import Store
from tests.conftest import gemm

FAST = TimingSettings(warmup_calls=1, warmup_floor_s=0, first_warmup_floor_s=0, min_samples=3, max_samples=5,
                      max_time_s=0)
BAD_NAME = os.fsdecode(b"/data/weights-\xff\xfe.bin")      # what os.listdir gives for a non-UTF-8 name


class _OddText:
    """prepare raises an OSError naming a non-UTF-8 file for m == 2 (and a NUL for m == 3); the others run."""

    name, op_type = "odd_text_for_test", "gemm"

    def supports(self, case, device):
        return None

    def prepare(self, case, device):
        if case.args.m == 2:
            raise OSError(f"cannot read {BAD_NAME}: not a checkpoint")   # the name itself, not its repr
        if case.args.m == 3:
            raise RuntimeError("kernel\x00name \udc80 not found")
        return Prepared(fn=lambda: None, check=lambda: Check(0.0, 0.01, 1, "planted \udcff reference"),
                        metadata={"path \udcfe": BAD_NAME, "list": [BAD_NAME, 1.5]})


register_backend("odd_text_for_test", "gemm", _OddText)


def _config(tmp_path, db_url, testlist):
    return RunConfig(testlist=str(testlist), device="cpu", db=db_url, results_dir=tmp_path / "res", timing=FAST,
                     backend="odd_text_for_test", executor="inline")


def _assert_storable(value):
    """No lone surrogate or NUL anywhere in a row document (keys included)."""
    text = json.dumps(value, ensure_ascii=False)
    text.encode("utf-8")                                          # raises on a lone surrogate
    assert "\x00" not in text


def test_an_odd_error_text_is_stored_with_replacement_characters_and_the_run_finishes(tmp_path, db_url,
                                                                                       write_testlist):
    path = write_testlist([gemm(m=1, n=64, k=64), gemm(m=2, n=64, k=64), gemm(m=3, n=64, k=64),
                           gemm(m=4, n=64, k=64)])
    outcome = run_testlist(_config(tmp_path, db_url, path))
    assert outcome.state == "finished" and outcome.unstored == 0
    assert [r.status for r in outcome.rows] == ["ok", "error", "error", "ok"]
    bad = outcome.rows[1]
    assert bad.message == f"OSError: cannot read /data/weights-{REPLACEMENT}{REPLACEMENT}.bin: not a checkpoint"
    assert "weights-\ufffd\ufffd.bin" in bad.traceback
    assert outcome.rows[2].message == f"RuntimeError: kernel{REPLACEMENT}name {REPLACEMENT} not found"
    ok = outcome.rows[0].metrics
    assert ok["check"]["reference"] == f"planted {REPLACEMENT} reference"
    assert ok["backend_meta"] == {f"path {REPLACEMENT}": f"/data/weights-{REPLACEMENT}{REPLACEMENT}.bin",
                                  "list": [f"/data/weights-{REPLACEMENT}{REPLACEMENT}.bin", 1.5]}
    store = Store(db_url, create=False)
    doc = store.document(outcome.run_id)
    assert doc["run"]["state"] == "finished" and [r["status"] for r in doc["rows"]] == ["ok", "error", "error", "ok"]
    assert doc["rows"][1]["message"] == bad.message
    _assert_storable(doc)
    _assert_storable(json.loads(outcome.document_path.read_text()))


def test_resume_runs_the_odd_case_again_and_stores_it(tmp_path, db_url, write_testlist):
    """The rows of cases 1 and 2 set back to `missing` (a run killed before they ended): the resume
    runs exactly them through the same backend and stores both."""
    from operatorx.run import resume_run

    path = write_testlist([gemm(m=1, n=64, k=64), gemm(m=2, n=64, k=64), gemm(m=3, n=64, k=64)])
    outcome = run_testlist(_config(tmp_path, db_url, path))
    store = Store(db_url, create=False)
    rows = store.rows(outcome.run_id)
    store.put_rows(outcome.run_id, [Row.missing(r.case, r.backend, r.testlist, r.case_index) for r in rows[1:]])
    store.finish_run(outcome.run_id, "2026-12-01T00:00:00+00:00", "interrupted")
    assert store.unfinished(outcome.run_id) == [1, 2]
    resumed = resume_run(outcome.run_id, db_url, results_dir=tmp_path / "res", backend="odd_text_for_test")
    assert resumed.state == "finished"
    assert [r.status for r in resumed.rows] == ["ok", "error", "error"]
    assert REPLACEMENT in resumed.rows[1].message and store.unfinished(outcome.run_id) == []


def test_a_row_is_made_storable_however_it_is_built():
    case = Case.model_validate(gemm())
    direct = Row(case=case, backend="b\udcff", status="error", testlist="t\x00", case_index=0,
                 message="m\ud800", error_kind="exception", traceback="x" * (TEXT_MAX_CHARS + 10) + "\udcffLAST",
                 failures=["f\udcff" * 5000], extra={"k\udcff": ["v\x00"]})
    assert direct.backend == "b\ufffd" and direct.testlist == "t\ufffd" and direct.message == "m\ufffd"
    assert direct.extra == {"k\ufffd": ["v\ufffd"]}
    assert len(direct.traceback) <= TEXT_MAX_CHARS and direct.traceback.endswith("\ufffdLAST")
    assert "characters left out" in direct.traceback
    assert len(direct.failures[0]) <= MESSAGE_MAX_CHARS
    long_message = Row(case=case, backend="b", status="error", testlist="t", case_index=0, message="y" * 10**6,
                       error_kind="exception")
    assert len(long_message.message) <= MESSAGE_MAX_CHARS and long_message.message.startswith("y" * 100)
    doc = direct.to_json()
    doc["metrics"]["worker_stderr_tail"] = "tail \udcff"
    doc["message"] = "from json \udcff"
    again = Row.from_json(json.loads(json.dumps(doc)))
    assert again.message == "from json \ufffd" and again.worker_stderr_tail == "tail \ufffd"
    _assert_storable(again.to_json())


def test_the_store_holds_run_records_with_odd_text(db_url):
    """A run record is not a row: the store's serializer makes it storable (a testlist path that is
    not UTF-8, a device name with NUL)."""
    store = Store(db_url)
    testlist = os.fsdecode(b"/lists/\xff.json")
    store.begin_run("odd", "2026-12-01T00:00:00", testlist, "torch", "cpu",
                    {"device": {"name": "CPU\x00 \udcff", "kind": "cpu"}, "host": "h\udcff", "args": [testlist]},
                    [Row.missing(Case.model_validate(gemm()), "torch", testlist, 0)])
    store.update_run_info("odd", {"note \udcff": "x\x00"})
    run = store.document("odd")["run"]
    assert run["testlist"] == "/lists/\ufffd.json" and run["device"]["name"] == "CPU\ufffd \ufffd"
    assert run["note \ufffd"] == "x\ufffd" and run["args"] == ["/lists/\ufffd.json"]
    (listed,) = store.list_runs()
    assert listed["testlist"] == "/lists/\ufffd.json"
    assert store.rows("odd")[0].testlist == "/lists/\ufffd.json"


@pytest.mark.parametrize("field", ["message", "label"])
def test_an_ingested_document_with_odd_text_is_stored(tmp_path, db_url, field):
    """A document made elsewhere (an older version, another tool) can hold such text too."""
    from typer.testing import CliRunner

    from operatorx.cli import app

    row = Row(case=Case.model_validate(gemm()), backend="torch", status="error", testlist="t", case_index=0,
              message="x", error_kind="exception").to_json()
    row[field] = "odd \udcff text"
    doc = {"schema_version": "1", "rows": [row],
           "run": {"id": "ingested-odd", "started_at": "2026-12-01T00:00:00", "finished_at": None,
                   "state": "finished", "testlist": "t", "backend": "torch", "host": "h\udcff"}}
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc))                              # ensure_ascii: the escape \udcff, as written
    r = CliRunner().invoke(app, ["db", "ingest", str(path), "--db", db_url])
    assert r.exit_code == 0, r.output
    stored = Store(db_url, create=False).document("ingested-odd")
    _assert_storable(stored)
    assert stored["run"]["host"] == "h\ufffd"
    if field == "message":
        assert stored["rows"][0]["message"] == "odd \ufffd text"


def test_replace_keeps_a_frozen_row_storable():
    """with_changes / model_copy paths revalidate (run/worker.py builds final rows that way)."""
    from operatorx.run.worker import with_changes

    row = Row(case=Case.model_validate(gemm()), backend="b", status="ok", testlist="t", case_index=0,
              metrics={"latency_us": 1.0})
    changed = with_changes(row, status="error", message="leak \udcff", error_kind="leak")
    assert changed.message == "leak \ufffd"
    assert replace is not None
