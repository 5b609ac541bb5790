"""The hostile corpus (tests/cli/hostile/): every malformed or hostile testlist gets a clear error
or a correct row from `testlist validate` and `run --device cpu`, never a traceback.

Each file's expected `validate` answer is in MANIFEST.json (make_corpus.py writes both).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from operatorx.cli import app
from operatorx.store import Store

pytestmark = pytest.mark.filterwarnings("ignore::operatorx.spec.TestlistWarning")
HOSTILE = Path(__file__).resolve().parent / "hostile"
MANIFEST: dict[str, str] = json.loads((HOSTILE / "MANIFEST.json").read_text())
runner = CliRunner()


def _clean(result) -> str:
    out = result.output
    assert "Traceback" not in out, out[-3000:]
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "\x1b" not in out and "\x07" not in out, "raw escape sequences reached the terminal"
    return out


def test_the_corpus_is_large_enough_and_matches_the_generator():
    files = sorted(p.name for p in HOSTILE.glob("*.json") if p.name != "MANIFEST.json")
    assert len(files) >= 80 and files == sorted(MANIFEST)


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_validate_gives_a_clear_answer(name):
    path = HOSTILE / name
    r = runner.invoke(app, ["testlist", "validate", str(path)])
    out = _clean(r)
    if MANIFEST[name] == "ok":
        assert r.exit_code == 0, out
        assert out.startswith(f"ok {path}") or f"ok {path}" in out
    else:
        assert r.exit_code == 1, out
        lines = [line for line in out.splitlines() if line.strip()]
        assert 1 <= len(lines) <= 21, out[:3000]
        assert all(line.startswith("error ") for line in lines), out[:3000]
        assert all(str(path) in line for line in lines if not line.startswith("error ... and")), out[:3000]


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_run_on_cpu_gives_an_error_or_correct_rows(name, tmp_path):
    path = HOSTILE / name
    db = tmp_path / "ox.db"
    r = runner.invoke(app, ["run", "-t", str(path), "--device", "cpu", "--db", str(db), "--results-dir",
                            str(tmp_path / "res"), "--executor", "inline", "--min-samples", "3", "--max-time", "0.05",
                            "--warmup-calls", "1", "--cpu-max-gflop", "1"])
    out = _clean(r)
    assert r.exit_code in (0, 1, 2), out
    if MANIFEST[name] == "error":
        assert r.exit_code == 2, out
        assert str(path) in out and not db.exists(), out[:3000]
        return
    if r.exit_code != 0:                     # an empty testlist: refused, naming the file
        assert name == "empty_array.json", out
        return
    rows = Store(str(db)).document("latest")["rows"]
    assert rows and all(row["status"] in ("ok", "unsupported") for row in rows), rows
    assert all(row["message"] for row in rows if row["status"] == "unsupported")
    shown = runner.invoke(app, ["results", "show", "latest", "--db", str(db)])
    _clean(shown)
    assert shown.exit_code == 0
    md = runner.invoke(app, ["results", "show", "latest", "--markdown", "--db", str(db)])
    assert "<script>" not in _clean(md)
    csv = runner.invoke(app, ["results", "export", "latest", "--format", "csv", "--db", str(db)])
    assert "\n=" not in _clean(csv) and ",=" not in csv.output


HOSTILE_BACKEND = '''
from operatorx.backends import Unsupported
from operatorx.backends.py_file import gemm_inputs


def ok(case, device, x=None):
    inputs = gemm_inputs(case, device)
    return lambda: inputs["a"] @ inputs["b"].T


def okany(case, device, **settings):
    return ok(case, device)


def refuse(case, device):
    raise Unsupported("[/m] \\x1b[31mno\\x1b[0m [enforce fail at alloc_cpu.cpp:127] <script>")


def fail(case, device):
    raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0 [/x] \\x1b]0;pwned\\x07")
'''


@pytest.mark.parametrize("spec,status", [("ok[x=1]", "ok"), ("ok[/x=1]", None), ("okany[/x=1]", "ok"),
                                         ("refuse", "unsupported"), ("fail", "error")])
def test_hostile_backend_strings_print_as_text(spec, status, tmp_path):
    backend = tmp_path / "b.py"
    backend.write_text(HOSTILE_BACKEND)
    db = tmp_path / "ox.db"
    name = f"py:{backend}:{spec}"
    r = runner.invoke(app, ["run", "-t", str(HOSTILE / "inj[v2].json"), "--device", "cpu", "--backend", name,
                            "--db", str(db), "--results-dir", str(tmp_path / "res"), "--executor", "inline",
                            "--min-samples", "3", "--max-time", "0.05", "--warmup-calls", "1"])
    out = _clean(r)
    if status is None:                       # not key=value: refused before the run, naming the spec
        assert r.exit_code == 2 and "[/x=1]" in out, out
        return
    assert r.exit_code == 0, out
    (row,) = Store(str(db)).document("latest")["rows"]
    assert row["status"] == status
    listed = runner.invoke(app, ["results", "list", "--db", str(db)])
    _clean(listed)
    assert listed.exit_code == 0
    assert Store(str(db)).document("latest")["run"]["backend"] == name
    shown = _clean(runner.invoke(app, ["results", "show", "latest", "--db", str(db)]))
    if status != "ok":
        assert "[enforce fail at alloc_cpu.cpp:127]" in " ".join(shown.split())


@pytest.mark.parametrize("arg", ["/dev/zero", "/tmp", "/no/such/file.json", "[/red]", "\x1b[31mx.json",
                                 "inj[v2]", ""])
def test_hostile_testlist_arguments_are_one_line(arg, tmp_path):
    r = runner.invoke(app, ["testlist", "validate", arg])
    out = _clean(r)
    assert r.exit_code == 1 and len(out.strip().splitlines()) == 1, out
    r = runner.invoke(app, ["run", "-t", arg, "--device", "cpu", "--db", str(tmp_path / "x.db")])
    out = _clean(r)
    assert r.exit_code == 2, out
    assert not (tmp_path / "x.db").exists()
