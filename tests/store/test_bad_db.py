"""Every kind of bad --db: one line naming the problem and the fix, exit code 2, no traceback,
and nothing created — checked by `check_db` (what a run calls before its first case), by the read
commands and by `db ingest`."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from operatorx.cli import app
from operatorx.store import Store, StoreError, check_db, write_json_atomic
from tests.store.conftest import done, planned

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _one_line_exit_2(args: list[str], *needles: str) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, (args, r.output, r.exception)
    assert not isinstance(r.exception, Exception) or isinstance(r.exception, SystemExit), r.exception
    text = r.output.strip()
    assert len(text.splitlines()) == 1 and text.startswith("error: "), text
    assert "Traceback" not in text
    for n in needles:
        assert n in text, (n, text)
    return text


@pytest.fixture
def doc_path(tmp_path: Path) -> Path:
    """A valid result document, made in a database elsewhere."""
    src = tmp_path / "src"
    src.mkdir()
    store = Store(str(src / "made.db"))
    store.begin_run("r1", "2026-11-30T00:00:00", "t", "torch", "cpu", {}, planned(2))
    store.put_row("r1", done(0))
    path = tmp_path / "doc.json"
    write_json_atomic(store.document("r1"), path)
    store.close()
    return path


def _bad_sqlite(tmp_path: Path, kind: str) -> tuple[str, str]:
    """(--db, words the message must hold) for each kind of bad SQLite file."""
    d = tmp_path / "bad"
    d.mkdir(exist_ok=True)
    if kind == "missing_dir":
        return str(d / "no" / "such" / "ox.db"), "does not exist"
    if kind == "text":
        (d / "notes.db").write_text("hello, this is a text file\n")
        return str(d / "notes.db"), "not an SQLite database"
    if kind == "directory":
        return str(d), "is a directory"
    good = d / "good.db"
    Store(str(good)).close()
    if kind == "corrupt":
        data = good.read_bytes()
        (d / "corrupt.db").write_bytes(data[:100] + bytes(range(256)) * ((len(data) - 100) // 256 + 1))
        return str(d / "corrupt.db"), "corrupt"
    if kind == "readonly":
        good.chmod(0o444)
        return str(good), "read-only"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["missing_dir", "text", "directory", "corrupt", "readonly"])
def test_bad_sqlite_for_writing(tmp_path, doc_path, kind):
    db, words = _bad_sqlite(tmp_path, kind)
    before = _files(tmp_path)
    with pytest.raises(StoreError, match=words):
        check_db(db, create=True)
    with pytest.raises(StoreError, match=words):
        Store(db)
    _one_line_exit_2(["db", "ingest", str(doc_path), "--db", db], words)
    _one_line_exit_2(["db", "init", "--db", db], words)
    assert _files(tmp_path) == before


@pytest.mark.parametrize("kind", ["missing_dir", "text", "directory", "corrupt"])
def test_bad_sqlite_for_reading(tmp_path, kind):
    db, words = _bad_sqlite(tmp_path, kind)
    words = "no database at" if kind == "missing_dir" else words
    before = _files(tmp_path)
    with pytest.raises(StoreError, match=words):
        check_db(db, create=False)
    for cmd in (["results", "list"], ["results", "show", "latest"], ["results", "export", "latest"],
                ["db", "check"]):
        _one_line_exit_2([*cmd, "--db", db], words)
    assert _files(tmp_path) == before


def test_a_read_only_database_can_still_be_read(tmp_path):
    db, _ = _bad_sqlite(tmp_path, "readonly")
    r = runner.invoke(app, ["results", "list", "--db", db])
    assert r.exit_code == 0, r.output
    assert runner.invoke(app, ["db", "check", "--db", db]).exit_code == 0


def test_results_list_never_creates_a_database(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _one_line_exit_2(["results", "list", "--db", "typo.db"], "no database at typo.db", "operatorx db init")
    _one_line_exit_2(["results", "show", "--db", "sqlite:///typo.db"], "no database at typo.db")
    assert _files(tmp_path) == set()


def test_an_empty_file_is_not_read_as_a_database(tmp_path):
    (tmp_path / "empty.db").touch()
    _one_line_exit_2(["results", "list", "--db", str(tmp_path / "empty.db")], "operatorx db init")
    check_db(str(tmp_path / "empty.db"), create=True)          # a writer may start one there


@pytest.mark.parametrize("db,words", [
    ("bogus://x", "unknown database kind 'bogus'"),
    ("mysql://u@h/d", "unknown database kind 'mysql'"),
    ("sqlite://", "in-memory"),
    ("postgresql+asyncpg://u@h/d", "psycopg 3"),
    ("postgresql://u@h", "no database name"),
    ("", "--db is empty"),
])
def test_bad_urls(tmp_path, monkeypatch, db, words):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match=words):
        check_db(db, create=True)
    _one_line_exit_2(["results", "list", "--db", db], words)
    _one_line_exit_2(["db", "init", "--db", db], words)
    assert _files(tmp_path) == set()


def test_unreachable_postgresql_server():
    db = "postgresql://postgres@127.0.0.1:1/ox"             # nothing listens on port 1
    with pytest.raises(StoreError, match="cannot reach PostgreSQL at 127.0.0.1:1"):
        check_db(db, create=True)
    _one_line_exit_2(["results", "list", "--db", db], "cannot reach PostgreSQL", "fix host and port")
    _one_line_exit_2(["db", "init", "--db", db], "cannot reach PostgreSQL")


def test_a_server_that_never_answers_is_given_up_on_within_5_s():
    """A port that accepts the connection but never says anything (a hung server, a firewall that
    swallows packets): the connect timeout ends it."""
    pytest.importorskip("psycopg")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)                       # the kernel accepts; nobody answers
    try:
        port = sock.getsockname()[1]
        t = time.monotonic()
        with pytest.raises(StoreError, match="within 5 s"):
            check_db(f"postgresql://postgres@127.0.0.1:{port}/ox", create=False)
        assert time.monotonic() - t < 8.0
        t = time.monotonic()
        with pytest.raises(StoreError, match="within 5 s"):
            Store(f"postgresql://postgres@127.0.0.1:{port}/ox")            # not retried: one timeout
        assert time.monotonic() - t < 8.0
    finally:
        sock.close()


def test_postgresql_database_that_does_not_exist(pg_server_db):
    db = pg_server_db.rsplit("/", 1)[0] + "/ox_store_no_such_db"
    _one_line_exit_2(["results", "list", "--db", db], "has no database 'ox_store_no_such_db'", "operatorx db init")
    with pytest.raises(StoreError, match="no database"):
        Store(db)


def test_postgresql_without_its_driver(tmp_path):
    """psycopg not installed (simulated: its import fails in a fresh interpreter)."""
    code = ("import sys; sys.modules['psycopg'] = None\n"
            "from operatorx.cli import main\n"
            "sys.argv = ['operatorx'] + sys.argv[1:]\n"
            "main()\n")
    for args in (["results", "list"], ["db", "init"]):
        p = subprocess.run([sys.executable, "-c", code, *args, "--db", "postgresql://postgres@127.0.0.1:5432/test"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert p.returncode == 2, p.stderr
        assert p.stderr.strip().count("\n") == 0 and "Traceback" not in p.stderr
        assert 'pip install "operatorx[postgres]"' in p.stderr
    assert _files(tmp_path) == set()


def test_the_real_command_prints_no_traceback(tmp_path):
    """The installed entry point, end to end, for one bad --db."""
    (tmp_path / "notes.db").write_text("not a database\n")
    p = subprocess.run([sys.executable, "-m", "operatorx", "results", "list", "--db", "notes.db"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("error: --db notes.db is not an SQLite database (it is a text file)")
    assert len(p.stderr.strip().splitlines()) == 1


def test_schema_older_or_newer_than_this_code(tmp_path):
    db = tmp_path / "ox.db"
    Store(str(db)).close()
    conn = sqlite3.connect(db)
    conn.execute("UPDATE ox_alembic_version SET version_num = '9999'")
    conn.commit()
    conn.close()
    _one_line_exit_2(["results", "list", "--db", str(db)], "newer than this OperatorX", "pip install -U")
    with pytest.raises(StoreError, match="newer"):
        Store(str(db))


def test_db_check_reads_every_page_of_a_sqlite_file(tmp_path):
    """Damage deep in the file that opening and listing never touch: `db check` finds it."""
    db = tmp_path / "ox.db"
    store = Store(str(db))
    for r in range(3):
        store.begin_run(f"r{r}", "2026-11-30T00:00:00", "t", "torch", "cpu", {}, planned(200))
    store.close()
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'ox_rows_run_index'").fetchone()[0]
    conn.close()
    data = bytearray(db.read_bytes())
    page = 4096
    data[(root - 1) * page + 8:(root - 1) * page + 2048] = bytes(range(256)) * 7 + bytes(248)
    db.write_bytes(bytes(data))
    assert runner.invoke(app, ["results", "list", "--db", str(db)]).exit_code == 0     # opening does not see it
    _one_line_exit_2(["db", "check", "--db", str(db)], "is corrupt")
