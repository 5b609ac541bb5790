"""Many processes on one database: creating it at once, writing at once, and a long reader."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from operatorx.store import Store
from tests.store.conftest import done, planned

ROOT = Path(__file__).resolve().parents[2]
T0 = "2026-11-30T00:00:00"


def _spawn(tmp_path: Path, name: str, code: str, *args: str) -> subprocess.Popen[str]:
    script = tmp_path / f"{name}.py"
    if not script.exists():        # written once: rewriting it while an earlier process reads it runs an empty file
        script.write_text(textwrap.dedent(code))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, str(script), *args], env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_all(procs: list[subprocess.Popen[str]], timeout: float = 120) -> None:
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err[-3000:]


_CREATE = """
    import sys, time
    from operatorx.store import Store
    db, start, i = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    time.sleep(max(0.0, start - time.time()))           # all start at the same instant
    store = Store(db)
    store.begin_run(f"run-{i}", "2026-11-30T00:00:00", "t", "torch", "cpu", {})
"""


def test_processes_creating_one_new_database_at_once_all_succeed(tmp_path, db_url):
    n = 8
    start = time.time() + 3.0                 # after every interpreter has started
    procs = [_spawn(tmp_path, "create", _CREATE, db_url, str(start), str(i)) for i in range(n)]
    _wait_all(procs)
    assert sorted(r["id"] for r in Store(db_url).list_runs()) == sorted(f"run-{i}" for i in range(n))


_WRITE = """
    import sys, time
    from tests.store.conftest import done
    from operatorx.store import Store
    db, start, worker, workers, cases = sys.argv[1], float(sys.argv[2]), *map(int, sys.argv[3:])
    store = Store(db, create=False)
    time.sleep(max(0.0, start - time.time()))
    for i in range(cases):
        if i % workers == worker or i % 7 == 0:        # cases i % 7 == 0: every worker writes them (a race)
            store.put_row("shared", done(i, latency_us=float(worker + 1)))
"""


def test_eight_concurrent_writers_leave_every_row_once(tmp_path, db_url):
    workers, cases = 8, 60
    store = Store(db_url)
    store.begin_run("shared", T0, "t", "torch", "cpu", {}, planned(cases))
    start = time.time() + 3.0
    procs = [_spawn(tmp_path, "write", _WRITE, db_url, str(start), str(w), str(workers), str(cases))
             for w in range(workers)]
    _wait_all(procs)
    doc = store.document("shared")
    assert [r["case_index"] for r in doc["rows"]] == list(range(cases))          # each once
    assert all(r["status"] == "ok" for r in doc["rows"]) and store.unfinished("shared") == []
    assert store.row_count() == cases


_HOLD_READ = """
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN")
    conn.execute("SELECT count(*) FROM ox_rows").fetchall()      # a read transaction, like an open DB browser
    print("holding", flush=True)
    time.sleep(float(sys.argv[2]))
    conn.execute("COMMIT")
"""

_HOLD_WRITE = """
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")                               # another writer, holding the write lock
    print("holding", flush=True)
    time.sleep(float(sys.argv[2]))
    conn.execute("COMMIT")
"""


def _held(tmp_path: Path, code: str, db: Path, seconds: float) -> subprocess.Popen[str]:
    p = _spawn(tmp_path, "hold", code, str(db), str(seconds))
    assert p.stdout is not None and p.stdout.readline().strip() == "holding"
    return p


def test_a_long_read_transaction_does_not_stop_a_writing_run(tmp_path):
    """The reported failure: a DB browser holding a read transaction for 20 s killed the run with
    `database is locked` (the old default busy timeout was 5 s). A hold that outlasts the busy timeout
    is what matters, so the test cuts the timeout to 1 s and holds for 4 s (four timeouts, as 20 s was
    four of the old 5 s): in WAL mode a reader never blocks the writer, and every write lands while
    the reader still holds its transaction."""
    db = tmp_path / "ox.db"
    store = Store(str(db), busy_timeout_s=1.0)
    store.begin_run("r", T0, "t", "torch", "cpu", {}, planned(20))
    # held far longer than the writes take even on a loaded CI machine, then ended: a write the reader
    # blocked would fail with `locked` after the 1 s timeout and its retries, long before the hold ends
    reader = _held(tmp_path, _HOLD_READ, db, 60.0)
    try:
        for i in range(20):
            store.put_row("r", done(i))
        store.finish_run("r", T0)
        assert reader.poll() is None                                    # done while the reader still held
    finally:
        reader.kill()
        reader.communicate(timeout=30)
    assert store.unfinished("r") == [] and store.document("r")["run"]["state"] == "finished"


def test_a_writer_holding_the_lock_longer_than_the_busy_timeout_is_waited_out(tmp_path):
    """Another process holding the write lock for 3 busy timeouts: put_row waits and retries, and
    the row is stored once the lock is free."""
    db = tmp_path / "ox.db"
    store = Store(str(db), busy_timeout_s=0.5)
    store.begin_run("r", T0, "t", "torch", "cpu", {}, planned(3))
    holder = _held(tmp_path, _HOLD_WRITE, db, 1.5)
    store.put_row("r", done(0))
    _wait_all([holder])
    assert store.unfinished("r") == [1, 2]


def test_busy_timeout_from_the_environment(monkeypatch, tmp_path):
    from operatorx.store import StoreError
    from operatorx.store.engine import busy_timeout_s

    monkeypatch.setenv("OPERATORX_DB_BUSY_TIMEOUT_S", "2.5")
    assert busy_timeout_s() == 2.5 and busy_timeout_s(1.0) == 1.0
    monkeypatch.setenv("OPERATORX_DB_BUSY_TIMEOUT_S", "soon")
    with pytest.raises(StoreError, match="OPERATORX_DB_BUSY_TIMEOUT_S"):
        Store(str(tmp_path / "x.db"))
    assert not (tmp_path / "x.db").exists()


def test_sqlite_is_in_wal_mode(tmp_path):
    import sqlite3

    Store(str(tmp_path / "ox.db"))
    assert sqlite3.connect(tmp_path / "ox.db").execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_postgresql_connection_dropped_mid_run_is_replaced(pg_url):
    """A sweep's pooled connection killed by the server (restart, idle timeout, a proxy): the next
    write gets a fresh connection instead of failing."""
    import psycopg

    store = Store(pg_url)
    store.begin_run("r", T0, "t", "torch", "cpu", {}, planned(3))
    store.put_row("r", done(0))
    with psycopg.connect(pg_url, autocommit=True) as admin:
        killed = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                               "WHERE datname = current_database() AND application_name = 'operatorx'").fetchone()
    assert killed is not None and killed[0] >= 1
    store.put_row("r", done(1))
    assert store.unfinished("r") == [2]


def test_a_run_completes_while_a_reader_holds_a_transaction_throughout(tmp_path):
    """End to end: `operatorx run` on the CPU, start to finish, while another program holds a read
    transaction on the file for longer than the whole run (with a 1 s busy timeout)."""
    db = tmp_path / "ox.db"
    Store(str(db)).close()
    reader = _held(tmp_path, _HOLD_READ, db, 600.0)
    try:
        env = {**os.environ, "OPERATORX_DB_BUSY_TIMEOUT_S": "1",
               "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        p = subprocess.run([sys.executable, "-m", "operatorx", "run", "-t", "gemm", "--device", "cpu", "--limit", "2",
                            "--db", str(db), "--results-dir", str(tmp_path / "res")], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
        assert reader.poll() is None                      # still holding when the run ended
    finally:
        reader.kill()
        reader.communicate()
    assert p.returncode == 0, p.stderr[-3000:]
    [run] = Store(str(db), create=False).list_runs()
    assert run["state"] == "finished" and run["counts"]["ok"] == 2 and run["rows"] == 2


def test_a_write_still_locked_after_the_retries_is_a_store_error_that_says_why(tmp_path):
    """What the sweep catches to keep the row in the document: one line, naming the lock and the knob."""
    from operatorx.store import StoreError

    db = tmp_path / "ox.db"
    store = Store(str(db), busy_timeout_s=0.1)
    store.begin_run("r", T0, "t", "torch", "cpu", {}, planned(2))
    holder = _held(tmp_path, _HOLD_WRITE, db, 30.0)
    try:
        t = time.monotonic()
        with pytest.raises(StoreError, match="stayed locked by another program.*OPERATORX_DB_BUSY_TIMEOUT_S") as err:
            store.put_row("r", done(0))
        assert time.monotonic() - t < 15 and "\n" not in str(err.value)
    finally:
        holder.kill()
        holder.communicate()
    store.put_row("r", done(0))                         # the lock gone, the same write goes through
    assert store.unfinished("r") == [1]



def test_a_reader_opening_as_a_run_creates_the_database_leaves_the_runs_wal_alone(tmp_path, monkeypatch):
    """The race behind a lost run: a reader (`results list`, the dashboard, a test polling) opens the
    file in the instant a run has made it, switched it to WAL, but not yet made its tables. The
    reader's open fails ("no database yet"); it must not take the still-empty -wal it did not see
    before for its own and delete it, or the run goes on committing into an unlinked file that no
    other process sees, and a kill throws every row away."""
    import sqlite3

    import operatorx.store.db as db_module
    from operatorx.store import StoreError

    path = tmp_path / "ox.db"
    real_state = db_module.schema_state
    run_conn: list[sqlite3.Connection] = []

    def state_while_a_run_starts(conn):  # type: ignore[no-untyped-def]
        run_conn.append(sqlite3.connect(path))            # the run's first connection, kept open
        run_conn[0].execute("PRAGMA journal_mode=WAL")
        run_conn[0].execute("SELECT count(*) FROM sqlite_master")      # its first read makes the -wal, empty
        return "empty", None

    path.touch()                  # the reader's first look: the file is there, empty, with no -wal yet
    monkeypatch.setattr(db_module, "schema_state", state_while_a_run_starts)
    with pytest.raises(StoreError, match="no OperatorX database yet"):
        Store(str(path), create=False)
    monkeypatch.setattr(db_module, "schema_state", real_state)
    assert path.with_name("ox.db-wal").exists()
    run = run_conn[0]                                    # the run goes on committing on its open connection
    run.execute("CREATE TABLE progress (case_index INTEGER)")
    run.executemany("INSERT INTO progress VALUES (?)", [(0,), (1,), (2,)])
    run.commit()
    # another process reads what the run committed while it still runs
    seen = subprocess.run([sys.executable, "-c", "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute("
                           "'SELECT count(*) FROM progress').fetchone()[0])", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert seen.stdout.strip() == "3", seen.stderr[-500:]
    run_conn[0].close()
