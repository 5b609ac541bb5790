"""A database password given to `operatorx run` stays in the parent process: a planted password is
found nowhere afterwards — the result document, every column of every table the run wrote (read
back raw), the commands' output, what the workers held and logged, the static site.

Against the real PostgreSQL (trust auth accepts any password, so the planted one really logs in).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import gemm
from tests.store.conftest import pg_server_db, pg_url  # noqa: F401 - the fixtures these tests use

TATTLE = Path(__file__).resolve().parents[1] / "run" / "planted" / "tattle.py"


def _with_password(url: str, password: str) -> str:
    user, rest = url.split("://", 1)[1].split("@", 1)
    return f"postgresql://{user}:{password}@{rest}"


def _cli(args: list[str], env: dict[str, str], cwd: Path, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "operatorx", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=timeout_s)


def _every_stored_value(url: str) -> str:
    """Every row of every table in the database's public schema, as text."""
    import psycopg

    out = []
    with psycopg.connect(url) as conn:
        tables = [t for (t,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        assert "ox_runs" in tables and "ox_rows" in tables
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                out.append(repr(row))
    return "\n".join(out)


def _every_file(directory: Path) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in sorted(directory.rglob("*")) if p.is_file())


def test_a_planted_password_is_found_nowhere(tmp_path, pg_url, write_testlist):  # noqa: F811
    planted = f"Pl4nted-{secrets.token_hex(8)}"
    in_env = f"EnvPl4nted-{secrets.token_hex(8)}"
    db = _with_password(pg_url, planted)
    tl = write_testlist([gemm(m=m, n=64, k=64, a={"dtype": "fp32"}, b={"dtype": "fp32"}, out="fp32")
                         for m in (1, 2, 3)])
    told = tmp_path / "told"
    told.mkdir()
    env = {**os.environ, "OX_TATTLE_DIR": str(told), "PGPASSWORD": in_env, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("OPERATORX_DB", None)
    res = tmp_path / "res"
    run = _cli(["run", "-t", str(tl), "--device", "cpu", "--backend", f"py:{TATTLE}:build", "--db", db,
                "--results-dir", str(res), "--min-samples", "3", "--warmup-calls", "1", "--max-time", "0"],
               env, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    outputs = [run.stdout, run.stderr]

    # the document: the display form, no password
    (doc_path,) = res.glob("*.json")
    doc = json.loads(doc_path.read_text())
    assert doc["run"]["job"]["config"]["db"] == _with_password(pg_url, "***")
    statuses = sorted(r["status"] for r in doc["rows"])
    assert statuses == ["error", "ok", "ok"], statuses          # m=2 exits: its row holds the worker's log tail
    crashed = next(r for r in doc["rows"] if r["status"] == "error")
    assert "db=''" in (crashed["metrics"].get("worker_stderr_tail") or ""), crashed
    run_id = doc["run"]["id"]

    # what the workers held: no database at all, and neither secret in their environment
    worker_views = list(told.glob("worker-*.txt"))
    assert worker_views
    for view in worker_views:
        text = view.read_text()
        assert "db=''" in text and "postgresql://" not in text, text[:2000]
        assert "PGPASSWORD" not in text and "OPERATORX_DB" not in text

    # the other commands over that database, and the static site
    for args in (["results", "list"], ["results", "show", run_id], ["results", "export", run_id],
                 ["run", "--resume", run_id, "--results-dir", str(res)],
                 ["report", "build", "-o", str(tmp_path / "site")]):
        got = _cli([*args, "--db", db], env, tmp_path)
        assert got.returncode == 0, (args, got.stderr[-2000:])
        outputs += [got.stdout, got.stderr]
    # a wrong port: the error names the server, not the password
    bad = _cli(["results", "list", "--db", db.replace(":5432/", ":1/")], env, tmp_path, timeout_s=60)
    assert bad.returncode == 2 and "cannot reach PostgreSQL" in bad.stderr and "Traceback" not in bad.stderr
    outputs += [bad.stdout, bad.stderr]

    everywhere = {"output": "\n".join(outputs), "documents": _every_file(res), "database": _every_stored_value(pg_url),
                  "workers": "\n".join(v.read_text() for v in worker_views), "site": _every_file(tmp_path / "site"),
                  "this machine's run record": _every_file(tmp_path / "cache")}
    for where, text in everywhere.items():
        assert planted not in text, where
        assert in_env not in text, where
    assert "***" in everywhere["database"]          # the provenance keeps the display form


def test_operatorx_db_names_the_database_when_db_is_not_given(tmp_path, pg_url, write_testlist):  # noqa: F811
    planted = f"Pl4nted-{secrets.token_hex(8)}"
    tl = write_testlist([gemm(m=1, n=64, k=64, a={"dtype": "fp32"}, b={"dtype": "fp32"}, out="fp32")])
    env = {**os.environ, "OPERATORX_DB": _with_password(pg_url, planted),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    run = _cli(["run", "-t", str(tl), "--device", "cpu", "--executor", "inline", "--results-dir",
                str(tmp_path / "res"), "--min-samples", "3", "--warmup-calls", "1", "--max-time", "0"], env, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert not (tmp_path / "operatorx.db").exists()              # the variable's database, not the default file
    listed = _cli(["results", "list", "--json"], env, tmp_path)
    assert listed.returncode == 0 and len(json.loads(listed.stdout)) == 1
    stored = _every_stored_value(pg_url)
    # the inline executor runs the job in the parent, whose environment holds the variable: not recorded
    assert "OPERATORX_DB" not in stored
    for text in (run.stdout, run.stderr, listed.stdout, stored, _every_file(tmp_path / "res")):
        assert planted not in text


@pytest.mark.parametrize("source", ["PGPASSWORD", "pgpass"])
def test_libpq_reads_the_password_from_the_environment_or_pgpass(tmp_path, monkeypatch, pg_url, source):  # noqa: F811
    """With no password in the URL, the driver takes it from PGPASSWORD or the password file, as libpq
    documents: OperatorX neither needs nor sees it."""
    from operatorx.store import Store

    planted = f"Pl4nted-{secrets.token_hex(8)}"
    if source == "PGPASSWORD":
        monkeypatch.setenv("PGPASSWORD", planted)
    else:
        monkeypatch.delenv("PGPASSWORD", raising=False)
        pgpass = tmp_path / "pgpass"
        pgpass.write_text(f"*:*:*:*:{planted}\n")
        pgpass.chmod(0o600)
        monkeypatch.setenv("PGPASSFILE", str(pgpass))
    store = Store(pg_url)
    with store.engine.connect() as conn:
        used = conn.connection.dbapi_connection.info.password  # type: ignore[union-attr]
    assert used == planted and planted not in store.url
    store.close()
