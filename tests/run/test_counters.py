"""Counters mode on the CPU, with a stand-in for ncu: the child runs, its rows get counters, the
document is rewritten, the child's exit code comes back, and failures leave the rows as stored."""

from __future__ import annotations

import inspect
import json
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest

from operatorx.cli.run import run_command
from operatorx.result import Row
from operatorx.run.counters import CountersError, child_command, run_with_counters
from operatorx.spec import Case
from operatorx.store import Store
from tests.conftest import fp8_block, gemm

_FAKE_NCU = '''#!{python}
"""A stand-in for ncu: checks its options, runs the command after them, writes a canned CSV."""
import json, os, subprocess, sys

VALUED = {{"--clock-control", "--cache-control", "--target-processes", "--nvtx-include", "--metrics", "--page",
          "--print-units", "--log-file"}}
FLAGS = {{"--nvtx", "--csv"}}
args = sys.argv[1:]
if args == ["--version"]:
    print("NVIDIA (R) Nsight Compute Command Line Profiler\\nVersion 2099.1.0.0 (build 1) (public-release)")
    sys.exit(0)
opts, i = {{}}, 0
while i < len(args) and args[i].startswith("--"):
    if args[i] in FLAGS:
        opts[args[i]], i = True, i + 1
    elif args[i] in VALUED:
        opts[args[i]], i = args[i + 1], i + 2
    else:
        sys.exit("fake ncu: unknown option " + args[i])
app = args[i:]
with open(os.environ["FAKE_NCU_ARGS"], "w") as f:
    json.dump({{"options": opts, "app": app}}, f)
if os.environ.get("FAKE_NCU_SIMULATE"):          # the child's entry point replaced by a simulator
    app = [app[0], os.environ["FAKE_NCU_SIMULATE"], *app[4:]]
rc = subprocess.run(app).returncode
with open(opts["--log-file"], "w") as f:
    f.write(open(os.environ["FAKE_NCU_CSV"]).read())
sys.exit(rc)
'''

_SIMULATED_CHILD = '''
"""Stands in for `operatorx run --counters-child --run-id ID`: stores rows as FAKE_CHILD_ROWS says."""
import json, os, sys
from pathlib import Path

from operatorx.result import Row
from operatorx.spec import Case
from operatorx.store import Store, write_json_atomic

args = sys.argv[1:]
assert "--counters-child" in args and "--counters" not in args, args
opt = lambda name: args[args.index(name) + 1]
run_id, db, results = opt("--run-id"), opt("--db"), Path(opt("--results-dir"))
statuses = json.loads(os.environ["FAKE_CHILD_ROWS"])
rc = int(os.environ.get("FAKE_CHILD_RC", "0"))
if statuses is None:                              # e.g. an invalid testlist: nothing stored
    sys.exit(rc)
store = Store(db)
store.begin_run(run_id, "2026-01-01T00:00:00+00:00", "t", "torch", "cpu", {"device_kind": "cpu"})
for i, status in enumerate(statuses):
    case = Case.model_validate({"type": "gemm", "sources": [], "args": {
        "m": i + 1, "n": 64, "k": 64, "a": {"dtype": "bf16"}, "b": {"dtype": "bf16"}, "out": "bf16"}})
    metrics = {"latency_us": 10.0 + i, "perturbed": "timed while running under ncu (--counters)"} \\
        if status == "ok" else {}
    store.add_row(run_id, Row(case=case, backend="torch", status=status, testlist="t", case_index=i,
                              message=None if status == "ok" else "why", metrics=metrics,
                              error_kind="exception" if status == "error" else None))
store.finish_run(run_id, "2026-01-01T00:01:00+00:00", "finished" if rc == 0 else "interrupted")
write_json_atomic(store.document(run_id), results / (run_id + ".json"))
sys.exit(rc)
'''

_HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
           '"Device","CC","thread_domain:push_pop_ranges","dram__throughput.avg.pct_of_peak_sustained_elapsed",'
           '"gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed",'
           '"sm__warps_active.avg.pct_of_peak_sustained_active"')
_UNITS = '"","","","","","","","","","","","","%","nsecond","%","%"'
_CSV = "\n".join([
    "==PROF== Connected to process 77 (python)", _HEADER, _UNITS,
    '"0","77","python","h","gemm_kernel","1","7","(128, 1, 1)","(8, 1, 1)","0","9.0","<default domain>:ox.counters/0",'
    '"30","3,000","60","40"',
    '"1","77","python","h","reduce_kernel","1","7","(128, 1, 1)","(1, 1, 1)","0","9.0",'
    '"<default domain>:ox.counters/0","90","1,000","20","80"',
    '"2","77","python","h","gemm_kernel","1","7","(128, 1, 1)","(8, 1, 1)","0","9.0","<default domain>:ox.counters/9",'
    '"30","3,000","60","40"',
    "==PROF== Disconnected from process 77", ""])


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    """The fake ncu's path; it writes what it was called with to tmp_path/ncu_args.json."""
    ncu = tmp_path / "bin" / "ncu"
    ncu.parent.mkdir()
    ncu.write_text(_FAKE_NCU.format(python=sys.executable))
    ncu.chmod(ncu.stat().st_mode | stat.S_IXUSR)
    sim = tmp_path / "sim_child.py"
    sim.write_text(_SIMULATED_CHILD)
    csv_file = tmp_path / "canned.csv"
    csv_file.write_text(_CSV)
    monkeypatch.setenv("FAKE_NCU_ARGS", str(tmp_path / "ncu_args.json"))
    monkeypatch.setenv("FAKE_NCU_CSV", str(csv_file))
    monkeypatch.setenv("FAKE_NCU_SIMULATE", str(sim))
    monkeypatch.setenv("FAKE_CHILD_ROWS", json.dumps(["ok", "unsupported", "ok"]))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))          # a kept CSV stays under tmp_path
    return ncu


def _argv(tmp_path, testlist: str = "unused.json") -> list[str]:
    return ["-t", testlist, "--device", "cpu", "--db", str(tmp_path / "ox.db"), "--results-dir",
            str(tmp_path / "res"), "--counters"]


def _run(tmp_path, ncu, argv=None):
    return run_with_counters(argv or _argv(tmp_path), str(tmp_path / "ox.db"), tmp_path / "res", ncu=str(ncu))


def _ncu_call(tmp_path) -> dict:
    return json.loads((tmp_path / "ncu_args.json").read_text())


def test_child_command_drops_counters_and_adds_child_options():
    cmd = child_command(["run", "-t", "gemm", "--counters", "--db", "x.db"], "RID")
    assert cmd == [sys.executable, "-m", "operatorx", "run", "-t", "gemm", "--db", "x.db", "--counters-child",
                   "--run-id", "RID"]
    for internal in (["--run-id", "X"], ["--run-id=X"], ["--counters-child"]):
        with pytest.raises(ValueError, match="set by --counters"):
            child_command(["-t", "gemm", *internal], "RID")


def test_no_ncu_runs_and_stores_nothing(tmp_path):
    with pytest.raises(CountersError, match="needs Nsight Compute"):
        _run(tmp_path, tmp_path / "no-such-ncu")
    with pytest.raises(CountersError, match="'ox-no-such-ncu-here' was not found on PATH"):
        run_with_counters(_argv(tmp_path), str(tmp_path / "ox.db"), tmp_path / "res", ncu="ox-no-such-ncu-here")
    assert not (tmp_path / "ox.db").exists() and not (tmp_path / "res").exists()


def test_counters_are_filed_beside_the_rows(tmp_path, fake_ncu):
    run_id, rc = _run(tmp_path, fake_ncu)
    assert rc == 0 and re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", run_id)    # sweep's run id format
    call = _ncu_call(tmp_path)
    assert call["options"]["--clock-control"] == "none" and call["options"]["--page"] == "raw"
    assert call["app"][:4] == [sys.executable, "-m", "operatorx", "run"]
    assert call["app"][-3:] == ["--counters-child", "--run-id", run_id] and "--counters" not in call["app"]
    assert not Path(call["options"]["--log-file"]).exists()          # the temporary CSV is cleaned up

    doc = Store(str(tmp_path / "ox.db")).document(run_id)
    ok, unsupported, missing = (r["metrics"] for r in doc["rows"])
    counters = ok["counters"]
    assert counters["duration_us"] == pytest.approx(4.0) and counters["kernel_count"] == 2
    assert counters["sm_throughput_pct"] == pytest.approx((60 * 3 + 20 * 1) / 4)
    assert counters["dram_throughput_pct"] == pytest.approx((30 * 3 + 90 * 1) / 4)
    assert counters["achieved_occupancy_pct"] == pytest.approx((40 * 3 + 80 * 1) / 4)
    assert [k["name"] for k in counters["kernels"]] == ["gemm_kernel", "reduce_kernel"]
    assert counters["tool"] == "ncu 2099.1.0.0"
    assert counters["clock_control"] == "none" and counters["cache_control"] == "all"
    assert ok["latency_us"] == 10.0 and ok["perturbed"].startswith("timed while running under ncu")
    assert "counters" not in unsupported                             # only ok rows are said to miss them
    assert missing["counters"] == {"missing": "ncu recorded no kernel in NVTX range ox.counters/2"}
    on_disk = json.loads((tmp_path / "res" / f"{run_id}.json").read_text())
    assert on_disk == json.loads(json.dumps(doc))                   # the document was rewritten


def test_child_exit_code_comes_back_and_its_rows_stay(tmp_path, fake_ncu, monkeypatch):
    monkeypatch.setenv("FAKE_CHILD_ROWS", json.dumps(["ok", "ok"]))   # crashed in case 2
    monkeypatch.setenv("FAKE_CHILD_RC", "3")
    run_id, rc = _run(tmp_path, fake_ncu)
    assert rc == 3
    doc = json.loads((tmp_path / "res" / f"{run_id}.json").read_text())
    assert doc["run"]["state"] == "interrupted" and len(doc["rows"]) == 2
    assert doc["rows"][0]["metrics"]["counters"]["kernel_count"] == 2
    assert doc["rows"][1]["metrics"]["counters"]["missing"].endswith("(the run under ncu exited with 3)")


def test_a_child_that_stored_nothing_leaves_no_database(tmp_path, fake_ncu, monkeypatch):
    monkeypatch.setenv("FAKE_CHILD_ROWS", "null")
    monkeypatch.setenv("FAKE_CHILD_RC", "2")
    run_id, rc = _run(tmp_path, fake_ncu)
    assert rc == 2 and not (tmp_path / "ox.db").exists() and not (tmp_path / "res").exists()


@pytest.mark.parametrize("csv_text", ["Segmentation fault (core dumped)\n", _CSV.replace('"3,000"', '"3.000.0"')])
def test_unreadable_csv_names_the_file_and_leaves_the_rows(tmp_path, fake_ncu, csv_text):
    (tmp_path / "canned.csv").write_text(csv_text)
    with pytest.raises(CountersError, match="cannot read ncu's CSV") as err:
        _run(tmp_path, fake_ncu)
    csv_path = _ncu_call(tmp_path)["options"]["--log-file"]
    assert csv_path in str(err.value) and Path(csv_path).is_file()  # kept for the user to look at
    doc = Store(str(tmp_path / "ox.db")).document("latest")
    assert len(doc["rows"]) == 3 and not any("counters" in r["metrics"] for r in doc["rows"])


def test_patch_metrics_merges_into_one_run_only(tmp_path):
    store = Store(str(tmp_path / "p.db"))
    for run in ("a", "b"):
        store.begin_run(run, "2026-01-01T00:00:00", "t", "torch", "cpu", {})
        for i in range(2):            # two cases: a row's identity is (case, backend, side) within a run
            store.add_row(run, Row(case=Case.model_validate(gemm(m=i + 1)), backend="torch", status="ok",
                                   testlist="t", case_index=i, metrics={"latency_us": 1.0, "scheme": "bf16"}))
    assert store.patch_metrics("a", {1: {"counters": {"duration_us": 2.0}}, 7: {"x": 1}}) == 1
    assert store.patch_metrics("a", {}) == 0
    rows_a, rows_b = (Store(str(tmp_path / "p.db")).document(r)["rows"] for r in ("a", "b"))
    assert rows_a[1]["metrics"] == {"latency_us": 1.0, "scheme": "bf16", "counters": {"duration_us": 2.0}}
    assert "counters" not in rows_a[0]["metrics"] and not any("counters" in r["metrics"] for r in rows_b)


_LEAD_OPTIONS = {"run_id", "counters_child"} - set(inspect.signature(run_command).parameters)


@pytest.mark.skipif(bool(_LEAD_OPTIONS), reason="`operatorx run` has no --counters-child / --run-id yet "
                    f"(missing parameters: {', '.join(sorted(_LEAD_OPTIONS))}); the real child cannot start")
def test_end_to_end_with_a_real_child(tmp_path, fake_ncu, write_testlist, monkeypatch):
    monkeypatch.delenv("FAKE_NCU_SIMULATE")
    path = write_testlist([gemm(m=2, n=64, k=64), fp8_block(), gemm(m=3, n=64, k=64)])
    argv = [*_argv(tmp_path, str(path)), "--min-samples", "3", "--warmup-calls", "1"]
    run_id, rc = _run(tmp_path, fake_ncu, argv)
    assert rc == 0
    doc = json.loads((tmp_path / "res" / f"{run_id}.json").read_text())
    assert doc["run"]["id"] == run_id and [r["status"] for r in doc["rows"]] == ["ok", "unsupported", "ok"]
    assert doc["rows"][0]["metrics"]["counters"]["duration_us"] == pytest.approx(4.0)
    assert "counters" not in doc["rows"][1]["metrics"]
    assert doc["rows"][2]["metrics"]["counters"] == {"missing": "ncu recorded no kernel in NVTX range ox.counters/2"}


@pytest.mark.gpu
def test_real_ncu_end_to_end(tmp_path, write_testlist):
    """On a GPU with ncu: every ok row of a real counters run gets its kernels' counters."""
    ncu = shutil.which("ncu")
    if ncu is None:
        pytest.skip("no ncu on PATH")
    path = write_testlist([gemm(m=16, n=1024, k=1024), gemm(m=64, n=2048, k=1024)])
    db, res = str(tmp_path / "ox.db"), tmp_path / "res"
    # the default --timing kernels: the child must switch itself to events (ncu holds CUPTI there)
    argv = ["-t", str(path), "--device", "cuda", "--db", db, "--results-dir", str(res), "--min-samples", "3",
            "--counters"]
    try:
        run_id, rc = run_with_counters(argv, db, res, ncu=ncu)
    except CountersError as err:
        if "ncu reported errors" in str(err):
            pytest.skip(f"ncu cannot profile on this machine: {err}")
        raise
    assert rc == 0
    doc = json.loads((res / f"{run_id}.json").read_text())
    assert [r["status"] for r in doc["rows"]] == ["ok", "ok"]
    for row in doc["rows"]:
        counters = row["metrics"]["counters"]
        assert "missing" not in counters, counters
        assert counters["kernel_count"] >= 1 and counters["duration_us"] > 0
        assert counters["tool"].startswith("ncu ") and counters["clock_control"] == "none"
        assert row["metrics"]["perturbed"].startswith("timed while running under ncu")
        assert row["metrics"]["method"] == "cuda_events"
