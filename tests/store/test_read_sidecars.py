"""A read command never changes a SQLite database: the file stays byte for byte as it was, the only
files it may leave are SQLite's -wal and -shm (which `.gitignore` covers for the default database), and
it never removes side files, so a writer running beside it keeps every commit."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from operatorx.store import Store
from tests.store.conftest import done, planned
from tests.web.conftest import free_port

SIDE = ("-wal", "-shm")


def _fill(db: Path) -> None:
    store = Store(str(db))
    store.begin_run("r1", "2026-11-30T00:00:00", "t", "torch", "cpu", {}, planned(3))
    for i in range(2):
        store.put_row("r1", done(i, latency_us=5.0 + i))
    store.finish_run("r1", "2026-11-30T00:10:00")
    store.close()


def _sidecars(db: Path) -> list[str]:
    return sorted(p.name for p in db.parent.iterdir() if p.name != db.name)


def _digest(db: Path) -> str:
    return hashlib.sha256(db.read_bytes()).hexdigest()


def _only_sqlite_side_files(db: Path) -> bool:
    return set(_sidecars(db)) <= {db.name + x for x in SIDE}


def test_a_reader_store_changes_nothing_and_leaves_only_sqlite_side_files(tmp_path):
    db = tmp_path / "ox.db"
    _fill(db)
    assert _sidecars(db) == []                     # a writer's last close removes them
    before = _digest(db)
    reader = Store(str(db), read_only=True)
    assert [r["id"] for r in reader.list_runs()] == ["r1"]
    assert _sidecars(db) == ["ox.db-shm", "ox.db-wal"]        # reading a WAL database makes them
    reader.close()
    assert _only_sqlite_side_files(db) and _digest(db) == before
    assert db.with_name("ox.db-wal").stat().st_size == 0      # nothing was written through them
    reader = Store(str(db), read_only=True)        # a command that never closes its store
    assert reader.document("r1")["rows"][1]["metrics"]["latency_us"] == 6.0
    del reader
    assert _only_sqlite_side_files(db) and _digest(db) == before
    writer = Store(str(db))                        # the next writer's last close removes them
    writer.close()
    assert _sidecars(db) == []


def test_gitignore_covers_the_default_databases_side_files():
    ignored = (Path(__file__).parents[2] / ".gitignore").read_text().splitlines()
    for name in ("operatorx.db", "operatorx.db-wal", "operatorx.db-shm"):
        assert "/" + name in ignored, name


def test_read_commands_change_nothing(tmp_path):
    db = tmp_path / "ox.db"
    _fill(db)
    before = _digest(db)
    base = [sys.executable, "-m", "operatorx"]
    for args in (["results", "list"], ["results", "show", "r1"], ["results", "export", "r1", "--format", "csv"],
                 ["results", "compare", "r1", "r1"], ["db", "check"]):
        done_ = subprocess.run([*base, *args, "--db", str(db)], capture_output=True, text=True, timeout=300)
        assert done_.returncode in (0, 1), (args, done_.stderr[-1000:])
        assert _only_sqlite_side_files(db) and _digest(db) == before, args
    out = tmp_path / "site"
    built = subprocess.run([*base, "report", "build", "--db", str(db), "-o", str(out), "--compare", "none"],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    assert (out / "run-r1.html").is_file() and set(_sidecars(db)) - {"ox.db-wal", "ox.db-shm"} == {"site"}
    assert _digest(db) == before


def test_serve_changes_nothing(tmp_path):
    db = tmp_path / "ox.db"
    _fill(db)
    before = _digest(db)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "operatorx", "serve", "--db", str(db), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/run/r1", timeout=5) as r:
                    assert r.status == 200 and "r1" in r.read().decode()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.2)
        assert _sidecars(db) == ["ox.db-shm", "ox.db-wal"]    # while it serves, its connections hold them
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    assert _only_sqlite_side_files(db) and _digest(db) == before


_WRITER = """
import sys, time
from operatorx.store import Store
from tests.store.conftest import done
store = Store(sys.argv[1])
store.put_row("r1", done(2, latency_us=7.0))
print("stored", flush=True)
sys.stdin.readline()                       # hold the database until told
store.put_row("r1", done(1, latency_us=9.0))
if sys.argv[2] == "crash":
    import os
    os._exit(0)                            # no close: its last commits stay in the -wal
store.close()
"""


def _writer(db: Path, how: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(db), how], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    assert proc.stdout is not None and proc.stdout.readline().strip() == "stored"
    return proc


def test_a_reader_leaves_a_running_writers_files_alone(tmp_path):
    db = tmp_path / "ox.db"
    _fill(db)
    writer = _writer(db, "close")
    assert _sidecars(db) == ["ox.db-shm", "ox.db-wal"]
    reader = Store(str(db), read_only=True)
    assert reader.document("r1")["rows"][2]["metrics"]["latency_us"] == 7.0
    reader.close()
    assert _sidecars(db) == ["ox.db-shm", "ox.db-wal"]        # the writer's, in use: kept
    assert writer.stdin is not None
    writer.stdin.write("\n")
    writer.stdin.close()
    assert writer.wait(60) == 0
    with Store(str(db), read_only=True) as again:             # the writer's rows after the reader: all there
        assert [r["metrics"].get("latency_us") for r in again.document("r1")["rows"]] == [5.0, 9.0, 7.0]
    assert _only_sqlite_side_files(db)


def test_a_reader_keeps_a_wal_that_holds_commits(tmp_path):
    """A writer killed before its close leaves commits only in the -wal: a reader sees them and leaves the
    -wal as it is (removing it would copy them into the file: a reader writes nothing)."""
    db = tmp_path / "ox.db"
    _fill(db)
    writer = _writer(db, "crash")
    assert writer.stdin is not None
    writer.stdin.write("\n")
    writer.stdin.close()
    assert writer.wait(60) == 0
    wal = db.with_name(db.name + "-wal")
    assert wal.stat().st_size > 0
    before, wal_before = _digest(db), _digest(wal)
    with Store(str(db), read_only=True) as reader:
        assert [r["metrics"].get("latency_us") for r in reader.document("r1")["rows"]] == [5.0, 9.0, 7.0]
    assert _sidecars(db) == ["ox.db-shm", "ox.db-wal"]
    assert _digest(db) == before and _digest(wal) == wal_before


_STEADY_WRITER = """
import sys
from operatorx.store import Store
from tests.store.conftest import done
store = Store(sys.argv[1])
for i in range(int(sys.argv[2])):
    store.put_row("r2", done(i, latency_us=float(i)))
store.close()
"""


def test_readers_opening_closing_and_holding_stores_beside_a_writer_lose_nothing(tmp_path):
    """Readers that open, close, drop and hold stores the whole time a writer commits: the database
    stays sound and holds every row the writer stored."""
    import gc
    import sqlite3

    db = tmp_path / "ox.db"
    _fill(db)
    seed = Store(str(db))
    seed.begin_run("r2", "2026-11-30T01:00:00", "t", "torch", "cpu", {}, planned(400))
    seed.close()
    writer = subprocess.Popen([sys.executable, "-c", _STEADY_WRITER, str(db), "400"],
                              cwd=Path(__file__).parents[2])
    held, opens = [], 0
    while writer.poll() is None or opens < 30:
        reader = Store(str(db), read_only=True)
        assert reader.document("r1")["rows"][0]["metrics"]["latency_us"] == 5.0
        if opens % 3 == 0:
            held.append(reader)
        elif opens % 3 == 1:
            reader.close()
        else:
            del reader
            gc.collect()
        opens += 1
    assert writer.wait(120) == 0
    for reader in held:
        reader.close()
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        con.close()
    with Store(str(db), read_only=True) as check:
        latencies = [r["metrics"].get("latency_us") for r in check.document("r2")["rows"]]
    assert sorted(latencies) == [float(i) for i in range(400)]
