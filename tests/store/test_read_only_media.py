"""Read commands read a database on read-only media: SQLite opens `mode=ro`, and `immutable=1` where the
directory cannot take the -wal/-shm (docs/database.md); PostgreSQL sessions of a reader are READ ONLY.

Tests run as root here and in CI, where `chmod 0o555` stops no write. So: the URI rule is checked with
`os.access` answering "not writable"; a real read-only mount is made in a private mount namespace
(`unshare -m`, where the kernel allows it); and a non-root user reads a 0o555 directory where one can
run this Python. Each of the last two skips, with the reason, where the machine cannot do it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from typer.testing import CliRunner

from operatorx.cli import app
from operatorx.store import Store
from operatorx.store.engine import sqlite_needs_immutable, sqlite_uri
from tests.store.conftest import done, planned

runner = CliRunner()


def _fill(db: str) -> None:
    store = Store(db)
    store.begin_run("r1", "2026-11-30T00:00:00", "t", "torch", "cpu", {}, planned(3))
    for i in range(2):
        store.put_row("r1", done(i, latency_us=5.0 + i))
    store.finish_run("r1", "2026-11-30T00:10:00")
    store.close()


def _not_writable(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    real = os.access

    def access(path, mode, *args, **kwargs):  # type: ignore[no-untyped-def]
        if Path(path) == directory and mode & os.W_OK:
            return False
        return real(path, mode, *args, **kwargs)
    monkeypatch.setattr(os, "access", access)


def test_a_reader_opens_mode_ro_and_immutable_only_where_the_directory_is_not_writable(tmp_path, monkeypatch):
    db = tmp_path / "ox.db"
    _fill(str(db))
    assert sqlite_uri(db, "ro").endswith("?mode=ro")              # a writable directory: plain read-only
    assert sqlite_uri(db, "rw").endswith("?mode=rw")
    _not_writable(monkeypatch, tmp_path)
    assert sqlite_needs_immutable(db)
    assert sqlite_uri(db, "ro").endswith("?mode=ro&immutable=1")
    assert sqlite_uri(db, "rw").endswith("?mode=rw")              # writers never read immutable
    for side in ("-wal", "-shm"):                                  # a live writer's side files: read them
        (tmp_path / f"ox.db{side}").write_bytes(b"")
    assert not sqlite_needs_immutable(db)
    for side in ("-wal", "-shm"):
        (tmp_path / f"ox.db{side}").unlink()
    before = sorted(p.name for p in tmp_path.iterdir())
    store = Store(str(db), create=False, read_only=True)         # really opened immutable
    assert [r["id"] for r in store.list_runs()] == ["r1"] and store.row_count("r1") == 3
    with pytest.raises(DBAPIError, match="(?i)readonly|read-only|read only"):
        with store.engine.begin() as conn:
            conn.execute(text("CREATE TABLE reader_was_here (x INTEGER)"))
    store.close()
    for args in (["results", "list"], ["results", "show", "r1"], ["results", "export", "r1"], ["db", "check"]):
        r = runner.invoke(app, [*args, "--db", str(db)])
        assert r.exit_code == 0, (args, r.output)
    assert sorted(p.name for p in tmp_path.iterdir()) == before    # no -wal, no -shm, nothing made


def test_a_reader_never_writes_on_postgresql(pg_url):
    _fill(pg_url)
    store = Store(pg_url, create=False, read_only=True)
    assert store.row_count("r1") == 3
    with pytest.raises(DBAPIError, match="read-only transaction"):
        with store.engine.begin() as conn:
            conn.execute(text("CREATE TABLE reader_was_here (x INTEGER)"))
    store.close()


_READ_COMMANDS = """
set -u
fail=0
for args in "results list" "results show r1" "results export r1" "results export r1 --format csv" "db check"; do
  out=$("$PY" -m operatorx $args --db "$DB" 2>&1) || { echo "FAILED: $args: $out"; fail=1; }
done
"$PY" -m operatorx report build --db "$DB" -o "$SITE" >/dev/null 2>&1 || { echo "FAILED: report build"; fail=1; }
"$PY" - "$DB" <<'PY' || fail=1
import sys
from starlette.testclient import TestClient
from operatorx.web import Queries
from operatorx.web.app import create_app
client = TestClient(create_app(Queries.open(sys.argv[1])))
for url in ("/", "/run/r1", "/case/r1/0", "/roofline/r1", "/shape?runs=r1"):
    status = client.get(url).status_code
    if status != 200:
        print("FAILED: serve", url, status)
        sys.exit(1)
PY
exit $fail
"""


def test_read_commands_on_a_read_only_mount(tmp_path):
    """A tmpfs remounted read-only in a private mount namespace: a real EROFS, root included."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = f"""
set -e
mount -t tmpfs -o size=16m tmpfs "$MNT"
"$PY" -c 'import sys; sys.path.insert(0, sys.argv[2]); from tests.store.test_read_only_media import _fill
_fill(sys.argv[1])' "$DB" "{Path(__file__).parents[2]}"
mount -o remount,ro "$MNT"
if touch "$MNT/probe" 2>/dev/null; then echo "NOT READ-ONLY"; exit 3; fi
test ! -e "$DB-wal" && test ! -e "$DB-shm"
{_READ_COMMANDS}
"""
    env = {**os.environ, "MNT": str(mnt), "DB": str(mnt / "ox.db"), "SITE": str(tmp_path / "site"),
           "PY": sys.executable}
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            f"mount -t tmpfs tmpfs {mnt} && umount {mnt}"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount in a private namespace here ({probe.stderr.strip()[:120]})")
    done_ = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", script], env=env,
                           capture_output=True, text=True, timeout=600)
    assert done_.returncode == 0, done_.stdout[-3000:] + done_.stderr[-3000:]
    assert "Traceback" not in done_.stdout + done_.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert not any(mnt.iterdir())               # the mount went with its namespace; nothing leaked here


def test_read_commands_as_a_user_who_cannot_write_the_directory():
    """chmod 0o555 binds everyone but root: run the readers as `nobody` where that user can run Python."""
    if os.geteuid() != 0:
        pytest.skip("needs root to hand the readers to another user (as non-root, chmod itself is the test)")
    try:
        probe = subprocess.run([sys.executable, "-c", "import operatorx.store, starlette"], user=65534, group=65534,
                               capture_output=True, text=True, cwd="/")
    except OSError as err:                     # the interpreter itself sits where nobody cannot reach
        pytest.skip(f"user nobody cannot run this Python ({err})")
    if probe.returncode != 0:
        pytest.skip(f"user nobody cannot run this Python ({(probe.stderr.strip().splitlines() or ['?'])[-1][:120]})")
    top = Path(tempfile.mkdtemp(prefix="ox-ro-"))
    try:
        top.chmod(0o755)
        data = top / "data"
        data.mkdir()
        site = top / "out"
        site.mkdir()
        os.chown(site, 65534, 65534)
        _fill(str(data / "ox.db"))
        data.chmod(0o555)
        env = {**os.environ, "DB": str(data / "ox.db"), "SITE": str(site / "site"), "PY": sys.executable,
               "HOME": str(site)}
        done_ = subprocess.run(["bash", "-c", _READ_COMMANDS], env=env, user=65534, group=65534, cwd=str(site),
                               capture_output=True, text=True, timeout=600)
        assert done_.returncode == 0, done_.stdout[-3000:] + done_.stderr[-3000:]
        assert sorted(p.name for p in data.iterdir()) == ["ox.db"]
    finally:
        (top / "data").chmod(0o755)
        shutil.rmtree(top, ignore_errors=True)


def test_check_reports_the_schema_of_a_read_only_copy(tmp_path, monkeypatch):
    db = tmp_path / "ox.db"
    _fill(str(db))
    _not_writable(monkeypatch, tmp_path)
    r = runner.invoke(app, ["results", "list", "--json", "--db", str(db)])
    assert r.exit_code == 0 and [x["id"] for x in json.loads(r.output)] == ["r1"]
    r = runner.invoke(app, ["db", "check", "--db", str(db)])
    assert r.exit_code == 0 and "1 runs, 3 rows" in r.output, r.output
