"""What comes from a document or a shared database is data, never code or a path.

A hostile document is ingested (a `py:` backend naming a file that leaves a marker when imported, a
`../` run id, foreign results and trace directories, a Ray address) and then resumed: its code never
runs, no file lands outside the results directory, and each refusal is one line naming what to do.
A run this machine started resumes from its own record, whatever the database says about it.
Against the real SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from operatorx.cli import app
from operatorx.result import SCHEMA_VERSION, Row
from operatorx.run.config import RunConfig
from operatorx.run.job import ABJob, JobSpec
from operatorx.run.resume import ledger_dir, remember_started, resume_spec
from operatorx.run.sweep import resume_run
from operatorx.spec import Case
from operatorx.store import Store, StoreError
from operatorx.store.ingest import ingest_document, prepare_document
from tests.conftest import gemm
from tests.store.conftest import db_url, pg_server_db, pg_url  # noqa: F401 - the fixtures these tests use

runner = CliRunner()
EVIL_SOURCE = '''
from pathlib import Path
Path({marker!r}).write_text("imported")          # what an attacker's file would do on import
def build(case, device):
    Path({marker!r}).write_text("called")
    return lambda: None
'''


@pytest.fixture(autouse=True)
def _own_ledger(tmp_path, monkeypatch):
    """This machine's record of started runs, for this test alone."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def evil(tmp_path) -> tuple[str, Path]:
    """A `py:` backend spec whose file leaves `marker` when it is imported or called."""
    marker = tmp_path / "PWNED-marker"
    path = tmp_path / "attacker" / "evil.py"
    path.parent.mkdir()
    path.write_text(EVIL_SOURCE.format(marker=str(marker)))
    return f"py:{path}:build", marker


def _case(m: int = 1) -> Case:
    return Case.model_validate(gemm(m=m, n=32, k=32, a={"dtype": "fp32"}, b={"dtype": "fp32"}, out="fp32"))


def _document(run_id: str, backend: str, job: dict[str, Any], n: int = 1) -> dict[str, Any]:
    """A document as an attacker would write one: every row `missing`, the run `interrupted`."""
    rows = [Row.missing(_case(i + 1), backend, "t", i).to_json() for i in range(n)]
    return {"schema_version": SCHEMA_VERSION, "rows": rows,
            "run": {"id": run_id, "started_at": "2026-11-30T00:00:00+00:00", "finished_at": None,
                    "state": "interrupted", "testlist": "t", "backend": backend, "device_kind": "cpu", "job": job}}


def _job(tmp_path: Path, backend: str, run_id: str = "../../escaped/PWNED", **over: Any) -> dict[str, Any]:
    config = RunConfig(testlist="t", backend=backend, device="cpu", executor="inline",
                       results_dir=tmp_path / "outside" / "results", trace_dir=tmp_path / "outside" / "traces",
                       ray_address="ray://attacker.example:10001", **over)
    return JobSpec(config=config, run_id=run_id, testlist="t").to_json()


def _clean(result: Any) -> str:
    out = result.output
    assert "Traceback" not in out, out[-3000:]
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return out


def _nothing_outside(tmp_path: Path, marker: Path) -> None:
    assert not marker.exists(), "code from the database ran"
    assert not (tmp_path / "outside").exists()
    # `../../escaped/PWNED` from --results-dir tmp_path/res, and from the working directory
    assert not (tmp_path.parent / "escaped").exists() and not (Path.cwd().parent.parent / "escaped").exists()


@pytest.mark.parametrize("bad_id", ["../../escaped/PWNED", "a/b", ".hidden", "-rf", "x\x1b[31m", "id\u202eevil",
                                    "x" * 65, ""])
def test_ingest_refuses_a_run_id_that_is_not_one(tmp_path, db_url, bad_id):  # noqa: F811
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(_document(bad_id, "torch", {})))
    r = runner.invoke(app, ["db", "ingest", str(path), "--db", db_url])
    out = _clean(r)
    assert r.exit_code == 2 and len(out.strip().splitlines()) == 1, out
    assert "run.id" in out and "\x1b" not in out and "\u202e" not in out
    assert Store(db_url).run_count() == 0


def test_resume_never_runs_a_stored_user_backend(tmp_path, db_url, evil):  # noqa: F811
    spec, marker = evil
    ingest_document(Store(db_url), _document("hostile-1", spec, _job(tmp_path, spec)))
    res = tmp_path / "res"
    r = runner.invoke(app, ["run", "--resume", "hostile-1", "--db", db_url, "--results-dir", str(res)])
    out = _clean(r)
    assert r.exit_code == 2 and len(out.strip().splitlines()) == 1, out
    assert "not started on this machine" in out and "--backend" in out and "user code" in out
    # another backend than the rows are for: refused too (its rows would stay `missing`)
    r = runner.invoke(app, ["run", "--resume", "hostile-1", "--backend", "torch", "--db", db_url, "--results-dir",
                            str(res)])
    out = _clean(r)
    assert r.exit_code == 2 and "rows are for backend" in out, out
    _nothing_outside(tmp_path, marker)
    assert list(res.iterdir()) == []
    assert Store(db_url).list_runs()[0]["state"] == "interrupted"     # a refused resume changes nothing


def test_resume_of_a_hostile_record_runs_the_command_line_backend_inside_the_results_dir(tmp_path, db_url, evil):  # noqa: F811
    """The rows are for `torch`; the stored job says py:evil, a `../` run id, foreign directories and a
    Ray address. `--backend torch` runs torch, writes RUN.json in --results-dir, and nothing else."""
    spec, marker = evil
    job = _job(tmp_path, spec)
    job["ab"] = {"a": spec, "b": spec, "settings": {}}
    ingest_document(Store(db_url), _document("hostile-2", "torch", job))
    res = tmp_path / "res"
    r = runner.invoke(app, ["run", "--resume", "hostile-2", "--db", db_url, "--results-dir", str(res)])
    assert r.exit_code == 2 and "--backend torch" in _clean(r)
    r = runner.invoke(app, ["run", "--resume", "hostile-2", "--backend", "torch", "--db", db_url, "--results-dir",
                            str(res)])
    out = _clean(r)
    assert r.exit_code == 0, out
    assert "--trace directory and Ray address are not used" in out
    _nothing_outside(tmp_path, marker)
    assert [p.name for p in res.iterdir()] == ["hostile-2.json"]
    doc = json.loads((res / "hostile-2.json").read_text())
    assert [(d["status"], d["op"]["backend"]) for d in doc["rows"]] == [("ok", "torch")]
    assert "trace_path" not in doc["rows"][0]["metrics"]


def test_resume_refuses_a_stored_run_id_that_would_name_a_path(tmp_path, db_url):  # noqa: F811
    """A database filled by something older than the ingest check: the id is refused before use."""
    store = Store(db_url)
    store.begin_run("../../escaped/PWNED", "2026-11-30T00:00:00", "t", "torch", "cpu",
                    {"job": _job(tmp_path, "torch")}, [Row.missing(_case(), "torch", "t", 0)])
    r = runner.invoke(app, ["run", "--resume", "../../escaped/PWNED", "--backend", "torch", "--db", db_url,
                            "--results-dir", str(tmp_path / "res")])
    out = _clean(r)
    assert r.exit_code == 2 and "cannot be resumed" in out and len(out.strip().splitlines()) == 1, out
    assert not (tmp_path.parent / "escaped").exists() and not (tmp_path / "escaped").exists()


def test_a_hostile_ab_record_is_refused(tmp_path, db_url, evil):  # noqa: F811
    spec, marker = evil
    label = f"ab: torch | {spec}"
    ingest_document(Store(db_url), _document("hostile-ab", label, _job(tmp_path, "ab")))
    with pytest.raises(ValueError, match="not started on this machine"):
        resume_run("hostile-ab", db_url)
    job = JobSpec(config=RunConfig(testlist="t", backend="ab", device="cpu"), run_id="hostile-ab", testlist="t",
                  ab=ABJob(a="torch", b="torch", settings={})).to_json()     # the label says py:evil, the job not
    ingest_document(Store(db_url), _document("hostile-ab", label, job))
    with pytest.raises(ValueError, match="A/B sides do not match"):
        resume_run("hostile-ab", db_url, backend=label)
    assert not marker.exists()


def test_ingest_refuses_a_trace_path_that_is_not_the_runs_own(tmp_path):
    doc = _document("tr-1", "torch", {})
    doc["rows"][0]["metrics"] = {"trace_path": "/etc/passwd"}
    with pytest.raises(StoreError, match=r"rows\[0\].metrics.trace_path"):
        prepare_document(doc, "hostile.json")
    doc["rows"][0]["metrics"] = {"trace_path": "../../x/tr-1-case00000.json"}
    with pytest.raises(StoreError, match="trace_path"):
        prepare_document(doc, "hostile.json")
    doc["rows"][0]["metrics"] = {"trace_path": "/data/traces/tr-1-case00000.json"}
    assert prepare_document(doc, "ok.json").rows[0]["metrics"]["trace_path"].endswith("tr-1-case00000.json")


def test_ingest_hides_a_password_an_older_operatorx_recorded():
    job = {"config": {"testlist": "t", "db": "postgresql://ox:OldS3cret@db.team/bench"}, "run_id": "old-1",
           "testlist": "t", "ab": None}
    doc = _document("old-1", "torch", job)
    doc["run"]["env"] = {"OPERATORX_DB": "postgresql://ox:OldS3cret@db.team/bench", "OMP_NUM_THREADS": "4"}
    prep = prepare_document(doc)
    assert "OldS3cret" not in json.dumps(prep.info)
    assert prep.info["job"]["config"]["db"] == "postgresql://ox:***@db.team/bench"
    assert prep.info["env"] == {"OMP_NUM_THREADS": "4"}


def test_a_run_started_here_resumes_from_this_machines_record(tmp_path, evil):
    """The ledger, not the database: even a stored record replaced by a hostile copy (same id, same
    backend label) resumes with what this machine started."""
    spec, marker = evil
    mine = JobSpec(config=RunConfig(testlist="t", backend="torch", device="cpu", trace_dir=tmp_path / "my-traces",
                                    db="postgresql://me:pw@h/db"), run_id="mine-1", testlist="t")
    remember_started(mine)
    entry = ledger_dir() / "mine-1.json"
    assert entry.stat().st_mode & 0o077 == 0 and "pw@" not in entry.read_text()
    hostile = _job(tmp_path, spec, run_id="mine-1")
    got = resume_spec("mine-1", "torch", {"job": hostile}, db="x.db", backend=None, results_dir=None, note=print)
    assert (got.config.backend, got.config.trace_dir, got.config.db) == ("torch", tmp_path / "my-traces", "x.db")
    assert got.config.results_dir == Path("operatorx-results") and got.run_id == "mine-1"
    # the database's copy names another backend: not this machine's run after all
    with pytest.raises(ValueError, match="not started on this machine"):
        resume_spec("mine-1", spec, {"job": hostile}, db="x.db", backend=None, results_dir=None, note=print)
    assert not marker.exists()


def test_unreadable_stored_settings_are_one_line(tmp_path, db_url):  # noqa: F811
    job = _job(tmp_path, "torch")
    job["config"]["limit"] = "many"                     # a type the settings do not take
    ingest_document(Store(db_url), _document("odd-1", "torch", job))
    r = runner.invoke(app, ["run", "--resume", "odd-1", "--backend", "torch", "--db", db_url, "--results-dir",
                            str(tmp_path / "res")])
    out = _clean(r)
    assert r.exit_code == 2 and "stored settings cannot be read" in out and len(out.strip().splitlines()) == 1, out
