from __future__ import annotations

import csv
import io
import json

import pytest
from typer.testing import CliRunner

from operatorx.cli import app
from tests.conftest import gemm
from tests.report.rows import store_ranked_run

runner = CliRunner()


def test_validate_ok_and_bad(write_testlist):
    good = write_testlist([gemm()], "good.json")
    bad = write_testlist([gemm(), None], "bad.json")
    assert runner.invoke(app, ["testlist", "validate", str(good), "gemm_fp8"]).exit_code == 0
    r = runner.invoke(app, ["testlist", "validate", str(bad)])
    assert r.exit_code == 1
    assert "case 1" in r.output and "null" in r.output


def test_show_counts_by_scheme():
    r = runner.invoke(app, ["testlist", "show", "gemm_fp8"])
    assert r.exit_code == 0 and "1x128" in r.output


def test_run_cpu_then_results(tmp_path, write_testlist):
    path = write_testlist([gemm(m=2, n=64, k=64), gemm(m=4096, n=4096, k=4096)])
    db = str(tmp_path / "ox.db")
    r = runner.invoke(app, ["run", "--testlist", str(path), "--device", "cpu", "--db", db, "--results-dir",
                            str(tmp_path / "res"), "--min-samples", "3", "--cpu-max-gflop", "1", "--strict"])
    assert r.exit_code == 0, r.output
    assert "1 ok, 1 unsupported, 0 error" in r.output
    assert runner.invoke(app, ["results", "list", "--db", db]).exit_code == 0
    assert "ok" in runner.invoke(app, ["results", "show", "latest", "--db", db]).output
    out = tmp_path / "doc.json"
    assert runner.invoke(app, ["results", "export", "latest", "--format", "json", "-o", str(out), "--db", db]
                         ).exit_code == 0
    assert json.loads(out.read_text())["schema_version"] == "1"
    csv = runner.invoke(app, ["results", "export", "latest", "--format", "csv", "--db", db]).output
    assert csv.startswith("case_index,")


def test_a_multi_rank_rows_world_and_skew_in_show_markdown_and_csv(tmp_path):
    db = str(tmp_path / "ox.db")
    store_ranked_run(db, "ranks-run")
    shown = runner.invoke(app, ["results", "show", "ranks-run", "--db", db], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    head = next(line for line in shown.output.splitlines() if "latency_us" in line)
    assert head.index("latency_us") < head.index("world") < head.index("skew_us") < head.index("TFLOP/s")
    line = next(line for line in shown.output.splitlines() if "tp2" in line)
    assert [c.strip() for c in line.split("│")[5:8]] == ["43.00", "2", "1.80"]
    md = runner.invoke(app, ["results", "show", "ranks-run", "--markdown", "--db", db]).output.splitlines()
    assert "| latency_us | world | skew_us |" in md[0] and "| 43.00 | 2 | 1.80 |" in md[2]
    assert "| 10.00 |  |  |" in md[3] and "| unsupported | - |  |  |" in md[4]
    text = runner.invoke(app, ["results", "export", "ranks-run", "--format", "csv", "--db", db]).output
    fields = ["world", "split", "latency_us_min", "skew_us", "capped_ranks"]
    header = text.splitlines()[0].split(",")
    assert header[header.index("world"):header.index("world") + 5] == fields
    ranked, single, unsupported = csv.DictReader(io.StringIO(text))
    assert [ranked[f] for f in fields] == ["2", "tp2", "41.2", ranked["skew_us"], "[1]"]
    assert float(ranked["skew_us"]) == pytest.approx(1.8)
    assert [single[f] for f in fields] == [unsupported[f] for f in fields] == [""] * 5


def test_strict_fails_without_ok_rows(tmp_path, write_testlist):
    path = write_testlist([gemm(m=4096, n=4096, k=4096)])
    r = runner.invoke(app, ["run", "-t", str(path), "--device", "cpu", "--db", str(tmp_path / "x.db"),
                            "--results-dir", str(tmp_path / "r"), "--cpu-max-gflop", "1", "--strict"])
    assert r.exit_code == 1


def test_invalid_testlist_exits_nonzero_and_stores_nothing(tmp_path, write_testlist):
    path = write_testlist([{"type": "gemm", "args": {"m": 1}}])
    db = tmp_path / "x.db"
    r = runner.invoke(app, ["run", "-t", str(path), "--device", "cpu", "--db", str(db)])
    assert r.exit_code == 2 and "nothing was run or stored" in r.output
    assert not db.exists()


def test_unknown_testlist_name(tmp_path):
    r = runner.invoke(app, ["run", "-t", "no_such_list", "--device", "cpu", "--db", str(tmp_path / "x.db")])
    assert r.exit_code == 2 and "no shipped testlist" in r.output


def test_unknown_backend_is_refused_before_anything_runs(tmp_path, write_testlist):
    db = tmp_path / "x.db"
    r = runner.invoke(app, ["run", "-t", str(write_testlist([gemm()])), "--backend", "tensorrt", "--device", "cpu",
                            "--db", str(db)])
    assert r.exit_code == 2 and "no such backend" in r.output and "torch" in r.output
    assert not db.exists()


def test_bad_timing_options_exit_2_naming_the_option_and_store_nothing(tmp_path, write_testlist):
    path = write_testlist([gemm()])
    db = tmp_path / "x.db"
    for option, value, named in (("--l2", "lukewarm", "l2_state"), ("--timing", "nvbench", "timing.mode"),
                                 ("--noise", "-1", "noise_target")):
        r = runner.invoke(app, ["run", "-t", str(path), "--device", "cpu", "--db", str(db), option, value])
        assert r.exit_code == 2 and named in r.output, (option, r.output)
    assert not db.exists()


def test_counters_without_ncu_says_so_and_stores_nothing(tmp_path, write_testlist, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))                      # no ncu anywhere
    path = write_testlist([gemm()])
    db = tmp_path / "x.db"
    r = runner.invoke(app, ["run", "-t", str(path), "--device", "cpu", "--db", str(db), "--counters"])
    assert r.exit_code == 2 and "ncu" in r.output
    assert not db.exists()


def test_nan_timing_options_are_refused(tmp_path, write_testlist):
    path = write_testlist([gemm()])
    db = tmp_path / "x.db"
    for option, named in (("--noise", "noise_target"), ("--max-time", "max_time_s")):
        r = runner.invoke(app, ["run", "-t", str(path), "--device", "cpu", "--db", str(db), option, "nan"])
        assert r.exit_code == 2 and named in r.output, (option, r.output)
    assert not db.exists()


def test_trace_where_no_trace_can_be_written_exits_2_before_the_run(tmp_path, write_testlist):
    path = write_testlist([gemm()])
    db = tmp_path / "x.db"
    a_file = tmp_path / "not_a_dir"
    a_file.write_text("x")
    for extra, said in ((["--device", "cuda", "--trace", str(a_file)], "not a directory"),
                        (["--device", "cpu", "--trace", str(tmp_path / "t")], "needs a CUDA device"),
                        (["--device", "cuda", "--counters", "--trace", str(tmp_path / "t")], "--counters")):
        r = runner.invoke(app, ["run", "-t", str(path), "--db", str(db), *extra])
        assert r.exit_code == 2 and said in r.output, (extra, r.output)
    assert not db.exists()
