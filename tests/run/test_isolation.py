"""Workers isolate faults: each planted fault ends as its own error row with its kind, and every
other case of the same run is ok (real worker processes, CPU device)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Optional

import pytest

from operatorx.measure import TimingSettings
from operatorx.run import RunConfig, run_testlist
from operatorx.store import Store
from tests.conftest import gemm
from tests.run.notes import Notes

PLANTED = Path(__file__).parent / "planted" / "misbehave.py"
FAST = TimingSettings(warmup_calls=1, warmup_floor_s=0, first_warmup_floor_s=0, min_samples=3, max_samples=5,
                      max_time_s=0)
OK_M = (16, 24, 32)


def fp32(m: int) -> dict:
    return gemm(m=m, n=64, k=64, a={"dtype": "fp32"}, b={"dtype": "fp32"}, out="fp32")


def config(tmp_path: Path, testlist: Path, **kw) -> RunConfig:
    return RunConfig(testlist=str(testlist), backend=f"py:{PLANTED}:build", device="cpu",
                     db=str(tmp_path / "ox.db"), results_dir=tmp_path / "res", timing=FAST, **kw)


def test_every_planted_fault_is_its_own_error_and_the_rest_is_ok(tmp_path, write_testlist):
    faults = {1: "timeout", 2: "crashed", 3: "crashed", 4: "crashed", 5: "leak", 6: "cuda_fault", 8: "oom"}
    cases = [fp32(m) for m in (OK_M[0], *faults, OK_M[1])] + [fp32(OK_M[2])]
    outcome = run_testlist(config(tmp_path, write_testlist(cases), case_timeout_s=8, leak_limit_host_mib=100,
                                  workers=2))
    by_m = {r.case.args.m: r for r in outcome.rows}
    assert outcome.state == "finished" and len(outcome.rows) == len(cases)
    for m, kind in faults.items():
        row = by_m[m]
        assert (row.status, row.error_kind) == ("error", kind), (m, row.status, row.error_kind, row.message)
    for m in OK_M:
        assert by_m[m].status == "ok" and by_m[m].latency_us is not None and by_m[m].latency_us > 0
    assert "SIGSEGV" in by_m[3].message                               # how the worker died is said
    assert "MiB of host memory" in by_m[5].message
    assert "illegal memory access" in by_m[6].message
    # the crash and the poisoned context were tried in a fresh worker once more, then given up
    assert len(by_m[3].metrics["failures"]) == 2
    doc = json.loads(outcome.document_path.read_text())
    assert doc["run"]["state"] == "finished"
    assert sorted((r["status"], r.get("error_kind")) for r in doc["rows"]) == sorted(
        (r.status, r.error_kind) for r in outcome.rows)
    assert Store(str(tmp_path / "ox.db")).unfinished(outcome.run_id) == []


def test_a_hang_times_out_while_a_long_case_waits_behind_it(tmp_path, write_testlist):
    """A case too long for the worker's stdin pipe is not sent ahead: written behind a hanging case it
    would block the parent's write, and the hang's deadline with it (the run never ended)."""
    cases = [fp32(1)] + [{**fp32(m), "metadata": {"blob": "x" * 100_000}} for m in OK_M]
    outcome = run_testlist(config(tmp_path, write_testlist(cases), case_timeout_s=3, workers=1))
    by_m = {r.case.args.m: r for r in outcome.rows}
    assert outcome.state == "finished"
    assert (by_m[1].status, by_m[1].error_kind) == ("error", "timeout")
    assert [by_m[m].status for m in OK_M] == ["ok"] * 3


def test_a_timeout_is_not_retried_and_takes_only_its_case(tmp_path, write_testlist):
    outcome = run_testlist(config(tmp_path, write_testlist([fp32(1), fp32(16)]), case_timeout_s=10))
    hung, ok = sorted(outcome.rows, key=lambda r: r.case.args.m)
    assert (hung.status, hung.error_kind) == ("error", "timeout") and "no row after 10 s" in hung.message
    # the worker wrote its Python stacks before the kill: the row says where the case waited
    hang_line = PLANTED.read_text().splitlines().index("            time.sleep(1000)") + 1
    assert hung.message.endswith(f"its worker waited at misbehave.py:{hang_line} in call"), hung.message
    assert "most recent call first" in hung.metrics["worker_stderr_tail"]
    assert ok.status == "ok"


@pytest.mark.parametrize("workers", [1, 2])
def test_all_cases_ok_on_one_or_two_workers(tmp_path, write_testlist, workers):
    outcome = run_testlist(config(tmp_path, write_testlist([fp32(m) for m in (16, 17, 18, 19)]), workers=workers))
    assert [r.status for r in outcome.rows] == ["ok"] * 4
    assert [r.case_index for r in outcome.rows] == [0, 1, 2, 3]
    # each worker's start-up, step by step, is kept with the run (on many GPUs it bounds the speed-up)
    workers_info = Store(str(tmp_path / "ox.db")).run_info(outcome.run_id)["workers"]
    assert len(workers_info) == workers
    for info in workers_info.values():
        steps = info["startup_s"]
        assert {"device", "stats", "run_info", "backend", "spawn_to_ready"} <= set(steps)
        assert steps["spawn_to_ready"] >= sum(v for k, v in steps.items() if k != "spawn_to_ready")


def test_the_first_case_imports_nothing_the_stopping_rule_needs(tmp_path, write_testlist):
    """SciPy's import (0.6 s here, up to 1.5 s on the H200 host) ran inside a worker's first case and
    spent its time cap: the worker now imports it while it starts (startup step `stats`)."""
    from operatorx.measure import stats
    from operatorx.run.job import JobSpec, build_job

    stats._median_ci_ranks.cache_clear()
    spec = JobSpec(config=config(tmp_path, write_testlist([fp32(16)])), run_id="r", testlist="t")
    build_job(spec)
    assert stats._median_ci_ranks.cache_info().currsize == 1        # the ranks, and SciPy with them, are loaded


def _compiling(tmp_path, write_testlist, compile_s: float, after_s: float, notes: Optional[Notes] = None, **kw):
    backend = f"py:{PLANTED}:build[compile_s={compile_s},after_s={after_s}]"
    outcome = run_testlist(replace(config(tmp_path, write_testlist([fp32(10)]), case_timeout_s=3, **kw),
                                   backend=backend), notes)
    (row,) = outcome.rows
    return row


def test_a_compile_past_the_deadline_is_waited_for_and_said(tmp_path, write_testlist):
    """The worker's `nvcc` still runs at the 3-s deadline: the deadline waits for it, and the run says so."""
    notes = Notes()
    row = _compiling(tmp_path, write_testlist, compile_s=4.5, after_s=0, notes=notes)
    assert row.status == "ok", row.message
    (said,) = [n for n in notes.notes if "--compile-grace" in n]
    moved = re.search(r"case 0's deadline moved (\d+) s past --case-timeout while its worker compiled", said)
    moved_s = float(moved[1]) if moved else -1.0
    assert 2 <= moved_s <= 6, said          # 4.5 s of compile past a 3-s deadline: one 2-s step, or the compile's CPU


def test_a_finished_compile_does_not_count_against_the_deadline(tmp_path, write_testlist):
    """2.5 s of compile, then 2 s of other work: 4.5 s in all, past the 3-s deadline with no compiler
    running at it; the reaped compile's time is added back."""
    row = _compiling(tmp_path, write_testlist, compile_s=2.5, after_s=2.0)
    assert row.status == "ok", row.message


def test_without_compile_grace_the_same_case_times_out(tmp_path, write_testlist):
    row = _compiling(tmp_path, write_testlist, compile_s=2.5, after_s=2.0, compile_grace_s=0)
    assert (row.status, row.error_kind) == ("error", "timeout")
    assert row.message.startswith("timeout: no row after 3 s (--case-timeout); its worker waited at"), row.message


def test_a_compile_that_outlasts_the_grace_times_out_and_says_so(tmp_path, write_testlist):
    row = _compiling(tmp_path, write_testlist, compile_s=60, after_s=0, compile_grace_s=3)
    assert (row.status, row.error_kind) == ("error", "timeout")
    said = ("timeout: no row after 3 s (--case-timeout) and 3 s more while its worker compiled kernels "
            "(--compile-grace); its worker waited at subprocess.py:")
    assert row.message.startswith(said), row.message
