"""A full disk loses no measurement: rows the database cannot store are in a file the run names
(the document, or the rows file written as each was refused), and `operatorx db ingest` of that
file restores every one; the run's end is stored when it can be, and the file carries it when not.

Real where it can be: a run under a file size limit (RLIMIT_FSIZE, what `ulimit -f` sets; SIGXFSZ
ignored so writes fail with EFBIG) grows its SQLite file past the limit. Where a real failure cannot
pick which write fails (the document, the temporary directory), the store's writes and the document's
write are made to fail with ENOSPC instead."""

from __future__ import annotations

import errno
import json
import re
import resource
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from operatorx.measure import TimingSettings
from operatorx.run import RunConfig, run_testlist
from operatorx.store import Store, StoreError
from operatorx.store.unstored import JOURNAL_KIND, UnstoredRows, is_journal, journal_document
from tests.conftest import gemm

PLANTED = Path(__file__).parent / "planted" / "hostile_env.py"
FAST = TimingSettings(warmup_calls=1, warmup_floor_s=0, first_warmup_floor_s=0, min_samples=3, max_samples=5,
                      max_time_s=0)
N_CASES = 12
FILE_LIMIT_BYTES = 96 * 1024
"""Above the database `db init` makes (56 KiB) and a 12-row document (~30 KiB), below what 12 rows
make of the database: its first rows are stored, the rest are refused."""


def _cases() -> list[dict]:
    return [gemm(m=20, n=64 + 8 * i, k=64, a={"dtype": "fp32"}, b={"dtype": "fp32"}, out="fp32")
            for i in range(N_CASES)]


def _ox(*args: str, limit_bytes: int | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        if limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run([sys.executable, "-m", "operatorx", *args], capture_output=True, text=True, timeout=600,
                          preexec_fn=limited, cwd=cwd)


def _statuses(db: Path, run_id: str) -> list[str]:
    return [r.status for r in Store(str(db), create=False).rows(run_id)]


def test_a_file_size_limit_keeps_every_row_in_the_document_and_ingest_restores_them(tmp_path, write_testlist):
    db, res = tmp_path / "ox.db", tmp_path / "res"
    assert _ox("db", "init", "--db", str(db)).returncode == 0
    run = _ox("run", "-t", str(write_testlist(_cases())), "--device", "cpu", "--backend", f"py:{PLANTED}:build",
              "--db", str(db), "--results-dir", str(res), "--min-samples", "3", "--warmup-calls", "1",
              "--max-time", "0", limit_bytes=FILE_LIMIT_BYTES)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert "Traceback" not in out
    said = re.search(r"the (\d+) row\(s\) the database could not store are in (\S+): `operatorx db ingest \2`", out)
    assert said is not None, out[-3000:]
    doc_path = Path(said.group(2))
    doc = json.loads(doc_path.read_text())
    run_id = doc["run"]["id"]
    assert [r["status"] for r in doc["rows"]] == ["ok"] * N_CASES                 # every measured row
    assert doc["run"]["unstored_rows"] == int(said.group(1)) > 0
    assert doc["run"]["state"] == "finished"
    assert "missing" in _statuses(db, run_id)                                      # the limit did refuse rows
    ingested = _ox("db", "ingest", str(doc_path), "--db", str(db))
    assert ingested.returncode == 0, ingested.stderr
    assert _statuses(db, run_id) == ["ok"] * N_CASES
    assert Store(str(db), create=False).list_runs()[0]["state"] == "finished"


def _failing_store(monkeypatch: pytest.MonkeyPatch, stored_rows: int) -> None:
    """The store takes `stored_rows` rows, then refuses every write as a full disk does; the run's
    final update is refused too."""
    real_put = Store._put
    taken: list[int] = []

    def put(self: Store, run_id: str, rows: list) -> None:
        if len(taken) + len(rows) > stored_rows:
            raise StoreError(f"cannot store a row in: the disk holding {self.url} is full")
        taken.extend(r.case_index for r in rows)
        real_put(self, run_id, rows)

    def finish(self: Store, *args: object, **kw: object) -> None:
        raise StoreError(f"cannot update the run in: the disk holding {self.url} is full")

    monkeypatch.setattr(Store, "_put", put)
    monkeypatch.setattr(Store, "finish_run", finish)


def _no_document(monkeypatch: pytest.MonkeyPatch) -> None:
    import operatorx.store as store_pkg
    import operatorx.store.document as document

    def full(data: object, path: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(document, "write_json_atomic", full)
    monkeypatch.setattr(store_pkg, "write_json_atomic", full, raising=False)


def _config(tmp_path: Path, testlist: Path, results_dir: Path) -> RunConfig:
    return RunConfig(testlist=str(testlist), backend=f"py:{PLANTED}:build", device="cpu", db=str(tmp_path / "ox.db"),
                     results_dir=results_dir, timing=FAST, workers=1)


@pytest.mark.parametrize("results_dir_usable", [True, False])
def test_with_no_document_anywhere_the_rows_file_holds_every_refused_row(tmp_path, write_testlist, monkeypatch,
                                                                          results_dir_usable):
    """The database refuses rows and the run's end, and no document can be written: the rows file,
    written as each row was refused, is what is left; beside the document when the results
    directory takes it, else in the temporary directory. Its ingest stores the rows and the run's
    end (the database said `running`)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    results_dir = tmp_path / "res" if results_dir_usable else blocker / "res"      # under a file: ENOTDIR
    testlist = write_testlist(_cases())
    _failing_store(monkeypatch, stored_rows=3)
    _no_document(monkeypatch)
    outcome = run_testlist(_config(tmp_path, testlist, results_dir))
    monkeypatch.undo()
    assert outcome.state == "finished" and not outcome.document_written
    assert outcome.unstored == N_CASES - 3
    journals = list((results_dir if results_dir_usable else temp).glob("*.unstored.jsonl"))
    assert len(journals) == 1 and outcome.saved is not None and str(journals[0]) in outcome.saved
    assert "`operatorx db ingest" in outcome.saved
    db = tmp_path / "ox.db"
    assert _statuses(db, outcome.run_id).count("missing") == N_CASES - 3
    assert Store(str(db), create=False).list_runs()[0]["state"] == "running"
    ingested = _ox("db", "ingest", str(journals[0]), "--db", str(db))
    assert ingested.returncode == 0, ingested.stderr
    assert _statuses(db, outcome.run_id) == ["ok"] * N_CASES
    assert Store(str(db), create=False).list_runs()[0]["state"] == "finished"
    # into a database that never saw the run: the run comes from the file's header, with its rows
    other = tmp_path / "other.db"
    assert _ox("db", "ingest", str(journals[0]), "--db", str(other)).returncode == 0
    assert _statuses(other, outcome.run_id) == ["ok"] * (N_CASES - 3)
    assert Store(str(other), create=False).list_runs()[0]["state"] == "finished"


def test_a_results_directory_that_cannot_take_the_document_sends_it_to_the_temporary_directory(
        tmp_path, write_testlist, monkeypatch):
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    _failing_store(monkeypatch, stored_rows=5)
    outcome = run_testlist(_config(tmp_path, write_testlist(_cases()), blocker / "res"))
    monkeypatch.undo()
    assert outcome.document_written and outcome.document_path.parent == temp
    assert outcome.saved is not None and str(outcome.document_path) in outcome.saved
    doc = json.loads(outcome.document_path.read_text())
    assert [r["status"] for r in doc["rows"]] == ["ok"] * N_CASES
    assert doc["run"]["state"] == "finished"                  # the end the database could not store
    assert list(temp.glob("*.unstored.jsonl")) == []         # the document holds them: no rows file left
    ingested = _ox("db", "ingest", str(outcome.document_path), "--db", str(tmp_path / "ox.db"))
    assert ingested.returncode == 0, ingested.stderr
    assert _statuses(tmp_path / "ox.db", outcome.run_id) == ["ok"] * N_CASES


def test_a_rows_file_cut_short_by_the_disk_loses_only_its_last_line(tmp_path):
    kept = UnstoredRows("r1", tmp_path, {"id": "r1", "started_at": "2026-12-01T00:00:00", "testlist": "t",
                                         "backend": "torch"})
    for i in range(3):
        assert kept.add(("k", str(i)), {"case_index": i, "status": "ok"}) is None
    kept.close("interrupted", "2026-12-01T00:01:00")
    path = tmp_path / "r1.unstored.jsonl"
    assert kept.path == path
    text = path.read_text()
    cut = text + '{"row":{"case_index":3,"sta'                # the write the full disk stopped
    assert is_journal(cut) and JOURNAL_KIND in cut.splitlines()[0]
    doc = journal_document(cut, str(path))
    assert [d["case_index"] for d in doc["rows"]] == [0, 1, 2]
    assert doc["run"]["state"] == "interrupted" and doc["run"]["finished_at"] == "2026-12-01T00:01:00"
    assert not is_journal('{"schema_version": 3, "run": {}, "rows": []}')


def test_a_rows_file_an_earlier_try_left_is_kept_when_the_document_holds_this_try(tmp_path):
    """A resume whose refused rows went into the document removes its rows file, unless an earlier
    try of the run had written to it: those rows may be in no document yet."""
    header = {"id": "r2", "started_at": "2026-12-01T00:00:00", "testlist": "t", "backend": "torch"}
    fresh = UnstoredRows("r2", tmp_path, header)
    fresh.add(("k", "0"), {"case_index": 0, "status": "ok"})
    fresh.discard()
    assert not (tmp_path / "r2.unstored.jsonl").exists()
    earlier = UnstoredRows("r2", tmp_path, header)
    earlier.add(("k", "0"), {"case_index": 0, "status": "ok"})
    earlier.close("interrupted", None)                      # that try could not write its document
    again = UnstoredRows("r2", tmp_path, header)
    again.add(("k", "1"), {"case_index": 1, "status": "ok"})
    again.discard()
    doc = journal_document((tmp_path / "r2.unstored.jsonl").read_text(), "r2")
    assert [d["case_index"] for d in doc["rows"]] == [0, 1]
