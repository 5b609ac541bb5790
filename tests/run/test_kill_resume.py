"""A run killed in any way loses at most the cases in flight, and `--resume` finishes it:
kill -9 of the parent, then resume, gives each case exactly once; SIGTERM ends the run
`interrupted` with a valid document and the command to resume it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from operatorx.store import Store
from tests.conftest import gemm

PLANTED = Path(__file__).parent / "planted" / "misbehave.py"
N_CASES = 12


def _testlist(tmp_path: Path, write_testlist) -> Path:
    # m=9: the planted backend sleeps slow_s per call, so the run is still going when it is killed
    return write_testlist([gemm(m=9, n=64 + 8 * i, k=64, a={"dtype": "fp32"}, b={"dtype": "fp32"}, out="fp32")
                           for i in range(N_CASES)])


def _start(tmp_path: Path, testlist: Path, *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "operatorx", "run", "-t", str(testlist), "--device", "cpu",
           "--backend", f"py:{PLANTED}:build[slow_s=0.2]", "--db", str(tmp_path / "ox.db"),
           "--results-dir", str(tmp_path / "res"), "--min-samples", "3", "--warmup-calls", "1", "--max-time", "0",
           *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for_rows(db: Path, at_least: int, timeout_s: float = 120) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if db.exists():
            try:
                runs = Store(str(db), create=False).list_runs()
                if runs and sum(n for s, n in runs[0]["counts"].items() if s != "missing") >= at_least:
                    return
            except Exception:  # noqa: BLE001 - the database may be half-created yet
                pass
        time.sleep(0.2)
    raise AssertionError(f"fewer than {at_least} rows after {timeout_s} s")


def _rows(db: Path, run_id: str) -> list[tuple[int, str]]:
    return sorted((r.case_index, r.status) for r in Store(str(db), create=False).rows(run_id))


def test_kill_9_then_resume_gives_every_case_once(tmp_path, write_testlist):
    tl = _testlist(tmp_path, write_testlist)
    proc = _start(tmp_path, tl)
    _wait_for_rows(tmp_path / "ox.db", 3)
    os.killpg(proc.pid, signal.SIGKILL)                 # the parent and everything it started
    proc.wait(timeout=30)
    store = Store(str(tmp_path / "ox.db"), create=False)
    run_id = store.resolve_run("latest")
    left = store.unfinished(run_id)
    assert 0 < len(left) < N_CASES
    done = subprocess.run([sys.executable, "-m", "operatorx", "run", "--resume", run_id, "--db",
                           str(tmp_path / "ox.db"), "--results-dir", str(tmp_path / "res")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = _rows(tmp_path / "ox.db", run_id)
    assert rows == [(i, "ok") for i in range(N_CASES)]            # each case exactly once, all final
    doc = json.loads((tmp_path / "res" / f"{run_id}.json").read_text())
    assert doc["run"]["state"] == "finished" and len(doc["rows"]) == N_CASES
    # resuming a finished run runs nothing and changes nothing
    again = subprocess.run([sys.executable, "-m", "operatorx", "run", "--resume", run_id, "--db",
                            str(tmp_path / "ox.db"), "--results-dir", str(tmp_path / "res")],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and _rows(tmp_path / "ox.db", run_id) == rows


def test_sigterm_interrupts_with_a_document_and_the_resume_command(tmp_path, write_testlist):
    tl = _testlist(tmp_path, write_testlist)
    proc = _start(tmp_path, tl, "--grace", "5")
    _wait_for_rows(tmp_path / "ox.db", 2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "Traceback" not in out
    store = Store(str(tmp_path / "ox.db"), create=False)
    run_id = store.resolve_run("latest")
    doc = json.loads((tmp_path / "res" / f"{run_id}.json").read_text())
    assert doc["run"]["state"] == "interrupted"
    statuses = [r["status"] for r in doc["rows"]]
    assert len(statuses) == N_CASES and statuses.count("ok") >= 2 and "missing" in statuses
    assert f"operatorx run --resume {run_id}" in out
