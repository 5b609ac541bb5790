"""`operatorx results compare A B`: documents or runs in, a table / Markdown / JSON out, exit codes for CI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from operatorx.cli import app
from tests.report.test_compare import _doc, _samples


@pytest.fixture
def docs(tmp_path):
    rng = np.random.default_rng(21)
    base = {1: _samples(rng), 2: _samples(rng), 3: _samples(rng)}
    a = _doc("run-a", base, run={"device": {"name": "NVIDIA H200"}, "driver": "570"})
    b = _doc("run-b", {1: [v * 1.05 for v in base[1]], 2: list(base[2]), 3: list(base[3])},
             run={"device": {"name": "NVIDIA H200"}, "driver": "575"})
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    return str(pa), str(pb)


def _run(*args):
    return CliRunner().invoke(app, ["results", "compare", *args])


def test_table_names_the_regression_and_the_differing_driver(docs):
    r = _run(*docs)
    assert r.exit_code == 0, r.output
    assert "slower" in r.output and "same" in r.output and "drivers differ: 570 vs 575" in r.output
    assert "1 slower" in r.output and "2 same" in r.output


def test_json_and_markdown(docs):
    r = _run(*docs, "--json")
    assert r.exit_code == 0
    out = json.loads(r.output)
    assert out["counts"] == {"faster": 0, "slower": 1, "same": 2, "ambiguous": 0, "missing": 0}
    assert out["cases"][0]["verdict"] == "slower" and out["a"] == "run-a" and out["min_effect"] == 0.02
    md = _run(*docs, "--markdown").output
    assert "| case | A µs | B µs | B/A [CI] | p | q | verdict | flags |" in md and "| slower |" in md


def test_fail_on_regression_exits_1_and_a_wider_band_lets_it_pass(docs):
    assert _run(*docs, "--fail-on-regression").exit_code == 1
    r = _run(*docs, "--fail-on-regression", "--min-effect", "0.1")
    assert r.exit_code == 0 and "slower" not in r.output.split("\n", 3)[-1].replace("0 slower", "")


@pytest.mark.parametrize("args, needle", [
    (["--min-effect", "1.5"], "--min-effect 1.5"),
    (["--alpha", "0"], "--alpha 0"),
    (["--json", "--markdown"], "choose one"),
])
def test_bad_options_are_one_line_and_exit_2(docs, args, needle):
    r = _run(*docs, *args)
    assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output


def test_bad_inputs_are_one_line_and_exit_2(docs, tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    for ref, needle in ((str(tmp_path / "nope.json"), "no such file"), (str(tmp_path / "bad.json"), "not a result"),
                        (str(tmp_path / "list.json"), "no \"rows\" list")):
        r = _run(docs[0], ref)
        assert r.exit_code == 2 and needle in r.output and len(r.output.strip().splitlines()) == 1, r.output
    r = _run("latest", docs[1], "--db", str(tmp_path / "missing.db"))
    assert r.exit_code == 2 and "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "missing.db").exists()


def test_two_stored_cpu_runs_compare_by_run_id(tmp_path, write_testlist):
    """End to end: two real runs in one database, compared by id prefix; every case is matched."""
    from operatorx.measure import TimingSettings
    from operatorx.run import RunConfig, run_testlist
    from tests.conftest import gemm

    path = write_testlist([gemm(m=2, n=64, k=64), gemm(m=8, n=64, k=64)])
    timing = TimingSettings(warmup_calls=1, warmup_floor_s=0, first_warmup_floor_s=0, min_samples=12,
                            max_samples=12, max_time_s=1)
    db = str(tmp_path / "ox.db")
    ids = [run_testlist(RunConfig(testlist=str(path), device="cpu", db=db, results_dir=tmp_path / "res",
                                  timing=timing, executor="inline")).run_id for _ in range(2)]
    r = _run(ids[0], ids[1][:12] if ids[1][:12] != ids[0][:12] else ids[1], "--db", db, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["counts"]["missing"] == 0 and len(out["cases"]) == 2
    assert all(c["a_samples"] == 12 and c["b_samples"] == 12 and c["ci_low"] is not None for c in out["cases"])
    assert _run(ids[0], "nosuchrun", "--db", db).exit_code == 2
