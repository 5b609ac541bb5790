"""docs/user-backends.md's example passes through `operatorx run`, and a first wrong guess is one clear error."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from operatorx.cli import app
from operatorx.store import Store
from tests.conftest import gemm, moe

runner = CliRunner()
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "user_gemm.py"


def _run(tmp_path, testlist, backend):
    db = tmp_path / "x.db"
    r = runner.invoke(app, ["run", "-t", str(testlist), "--device", "cpu", "--backend", backend, "--db", str(db),
                            "--results-dir", str(tmp_path / "res"), "--min-samples", "3", "--max-time", "0.2"])
    return r, db


def test_the_documented_example_gives_checked_ok_rows(tmp_path, write_testlist):
    path = write_testlist([gemm(m=2, n=64, k=64), gemm(m=4, n=32, k=64, bias=True), moe()])
    for backend in (f"py:{EXAMPLE}:matmul", f"py:{EXAMPLE}:matmul[transpose_b=true]"):
        r, db = _run(tmp_path, path, backend)
        assert r.exit_code == 0, r.output
        rows = Store(str(db)).document("latest")["rows"]
        assert [row["status"] for row in rows] == ["ok", "ok", "unsupported"]
        for row in rows[:2]:
            check = row["metrics"]["check"]
            assert check["ok"] is True and check["rel_error"] <= check["bound"]
        assert "GEMMs only" in rows[2]["message"]


def test_a_first_guess_signature_is_one_clear_error_exit_2(tmp_path, write_testlist):
    guess = tmp_path / "b.py"
    guess.write_text("def build(m, n, k):\n    return lambda: None\n")
    path = write_testlist([gemm()])
    r, db = _run(tmp_path, path, f"py:{guess}:build")
    assert r.exit_code == 2, r.output
    assert "build(m, n, k) cannot be called as build(case, device)" in r.output
    assert "docs/user-backends.md" in r.output and "Traceback" not in r.output
