"""SIGHUP (a closed terminal or ssh session) stops a run as SIGTERM does: no new case, the cases in
flight get their grace, the run is stored `interrupted` with its document, and `--resume` finishes
it. Real subprocesses: one whose output is a pipe, one on a pseudo-terminal that is closed (hung
up) before the signal, as sshd does, and one started under `nohup` (SIGHUP ignored), which runs on."""

from __future__ import annotations

import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path

from operatorx.store import Store
from operatorx.store.schema import rows
from tests.conftest import gemm

PLANTED = Path(__file__).parent / "planted" / "misbehave.py"


def _testlist(write_testlist, n: int) -> Path:
    # m=9: the planted backend sleeps slow_s per call, so the run is still going when the signal comes
    return write_testlist([gemm(m=9, n=64 + 8 * i, k=64, a={"dtype": "fp32"}, b={"dtype": "fp32"}, out="fp32")
                           for i in range(n)])


def _wait_for_rows(db: Path, at_least: int, timeout_s: float = 180) -> None:
    """Until the run has `at_least` final rows, read through SQLite's read-only mode: a read that
    can never touch the files of the database the run is still creating."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as conn:
                done = conn.execute(f"SELECT count(*) FROM {rows.name} WHERE status != 'missing'").fetchone()[0]
            if done >= at_least:
                return
        except sqlite3.Error:            # not created yet, or its tables not yet
            pass
        time.sleep(0.2)
    raise AssertionError(f"fewer than {at_least} final rows after {timeout_s} s")


def _cmd(tmp_path: Path, testlist: Path) -> list[str]:
    return [sys.executable, "-m", "operatorx", "run", "-t", str(testlist), "--device", "cpu",
            "--backend", f"py:{PLANTED}:build[slow_s=0.2]", "--db", str(tmp_path / "ox.db"),
            "--results-dir", str(tmp_path / "res"), "--min-samples", "3", "--warmup-calls", "1", "--max-time", "0",
            "--grace", "5"]


def _hangup_default() -> None:
    """The run's SIGHUP as a terminal's child has it, whatever the tests were started under (a suite run
    under `nohup` hands every child an ignored SIGHUP, which the run keeps, as it should)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _interrupted(tmp_path: Path, n: int) -> str:
    """The run's id, after checking its document and stored state say `interrupted` with some rows
    final and some missing."""
    store = Store(str(tmp_path / "ox.db"), create=False)
    run_id = store.resolve_run("latest")
    doc = json.loads((tmp_path / "res" / f"{run_id}.json").read_text())
    statuses = [r["status"] for r in doc["rows"]]
    assert doc["run"]["state"] == "interrupted"
    assert store.list_runs()[0]["state"] == "interrupted"
    assert len(statuses) == n and statuses.count("ok") >= 2 and "missing" in statuses
    return run_id


def test_sighup_interrupts_with_a_document_and_the_resume_finishes_it(tmp_path, write_testlist):
    n = 12
    proc = subprocess.Popen(_cmd(tmp_path, _testlist(write_testlist, n)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=_hangup_default)
    _wait_for_rows(tmp_path / "ox.db", 2)
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in out + err
    assert "SIGHUP: no new cases" in err
    run_id = _interrupted(tmp_path, n)
    assert f"operatorx run --resume {run_id}" in out
    done = subprocess.run([sys.executable, "-m", "operatorx", "run", "--resume", run_id, "--db",
                           str(tmp_path / "ox.db"), "--results-dir", str(tmp_path / "res")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [r.status for r in Store(str(tmp_path / "ox.db"), create=False).rows(run_id)] == ["ok"] * n


def test_sighup_after_the_terminal_hung_up_still_writes_the_document(tmp_path, write_testlist):
    """Output on a pseudo-terminal (the progress bar draws there); the terminal's other end is closed,
    so every write to it fails (EIO), then SIGHUP comes: the run must still end `interrupted`."""
    n = 12
    master, slave = os.openpty()
    proc = subprocess.Popen(_cmd(tmp_path, _testlist(write_testlist, n)), stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave, start_new_session=True, preexec_fn=_hangup_default)
    os.close(slave)
    reading = threading.Event()
    reading.set()

    def drain() -> None:                    # the terminal shows what it is sent: nothing blocks on it
        while reading.is_set():
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    os.read(master, 65536)
                except OSError:
                    return

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        _wait_for_rows(tmp_path / "ox.db", 2)
    finally:
        reading.clear()
        reader.join(timeout=30)
    os.close(master)                        # the terminal is gone: the run's writes to it now fail
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=180) == 130
    _interrupted(tmp_path, n)


def test_a_run_started_under_nohup_runs_on_through_sighup(tmp_path, write_testlist):
    n = 6

    def nohup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    proc = subprocess.Popen(_cmd(tmp_path, _testlist(write_testlist, n)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=nohup)
    _wait_for_rows(tmp_path / "ox.db", 1)
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    store = Store(str(tmp_path / "ox.db"), create=False)
    run_id = store.resolve_run("latest")
    assert store.list_runs()[0]["state"] == "finished"
    assert [r.status for r in store.rows(run_id)] == ["ok"] * n
