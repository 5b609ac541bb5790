"""The pipeline on the CPU: testlist → case → backend → measurement → row → store."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from operatorx.backends import Check, Prepared, register_backend
from operatorx.measure import TimingSettings
from operatorx.run import RunConfig, run_testlist
from operatorx.spec import TestlistError
from operatorx.store import Store
from tests.conftest import fp8_block, gemm, moe
from tests.run.notes import Notes

FAST = TimingSettings(warmup_calls=1, warmup_floor_s=0, first_warmup_floor_s=0, min_samples=3, max_samples=5,
                      max_time_s=0)


def _config(tmp_path, testlist, **kw):
    # inline: the backends these tests register exist in this process only (test_isolation.py runs
    # the same pipeline through worker processes)
    kw.setdefault("executor", "inline")
    return RunConfig(testlist=str(testlist), device="cpu", db=str(tmp_path / "ox.db"),
                     results_dir=tmp_path / "res", timing=FAST, **kw)


def test_cpu_run_stores_every_case(tmp_path, write_testlist):
    path = write_testlist([gemm(m=2, n=64, k=64), fp8_block(), gemm(m=4, n=64, k=64, a={"dtype": "fp32"},
                                                                     b={"dtype": "fp32"}, out="fp32")])
    outcome = run_testlist(_config(tmp_path, path))
    assert [r.status for r in outcome.rows] == ["ok", "unsupported", "ok"]
    ok = outcome.rows[0].metrics
    assert ok["clock"] == "host" and ok["method"] == "host_clock/perf_counter"
    assert len(ok["samples_us"]) >= 3 and ok["latency_us"] == pytest.approx(sorted(ok["samples_us"])[
        len(ok["samples_us"]) // 2], rel=0.5)
    assert ok["check"]["ok"] and ok["tflops"] > 0 and ok["gbps"] > 0
    assert "fp8 on CPU" in outcome.rows[1].message
    doc = json.loads(outcome.document_path.read_text())
    assert doc["run"]["state"] == "finished" and len(doc["rows"]) == 3
    # 3-5 samples: no 95% interval of the median exists, so its noise is unknown (None), and the
    # row is strict JSON (no Infinity/NaN constants, which a JSON column of another database refuses)
    assert ok["noise"] is None and ok["summary_us"]["median_noise"] is None
    json.dumps([r.metrics for r in outcome.rows], allow_nan=False)
    assert Store(str(tmp_path / "ox.db")).row_count(outcome.run_id) == 3


def test_invalid_testlist_runs_and_stores_nothing(tmp_path, write_testlist):
    path = write_testlist([gemm(), {**gemm(), "args": {**gemm()["args"], "m": "1"}}])
    with pytest.raises(TestlistError, match="case 1: args.m"):
        run_testlist(_config(tmp_path, path))
    assert not (tmp_path / "ox.db").exists()
    assert not (tmp_path / "res").exists()


def test_filter_and_limit(tmp_path, write_testlist):
    path = write_testlist([gemm(m=1, n=64, k=64), gemm(m=2, n=64, k=64), gemm(m=3, n=128, k=64)])
    outcome = run_testlist(_config(tmp_path, path, filter="x64x64", limit=1))
    assert [r.case.args.m for r in outcome.rows] == [1]


def test_cpu_work_budget_makes_large_cases_unsupported(tmp_path, write_testlist):
    path = write_testlist([gemm(m=4096, n=4096, k=4096)])
    outcome = run_testlist(_config(tmp_path, path, cpu_max_gflop=1))
    assert outcome.rows[0].status == "unsupported" and "cpu_max_gflop" in outcome.rows[0].message


class _Wrong:
    """A backend whose output is 10% off: its row must be an error, not a timing."""

    name, op_type = "wrong_for_test", "gemm"

    def supports(self, case, device):
        return None

    def prepare(self, case, device):
        return Prepared(fn=lambda: None, check=lambda: Check(0.1, 0.01, 4, "planted"))


class _Crash:
    name, op_type = "crash_for_test", "gemm"

    def supports(self, case, device):
        return None

    def prepare(self, case, device):
        if case.args.m == 2:
            raise RuntimeError("device fault (planted)")
        return Prepared(fn=lambda: None, check=lambda: Check(0.0, 0.01, 1, "planted"))


register_backend("wrong_for_test", "gemm", _Wrong)
register_backend("crash_for_test", "gemm", _Crash)


def test_wrong_result_is_an_error_row(tmp_path, write_testlist):
    outcome = run_testlist(_config(tmp_path, write_testlist([gemm()]), backend="wrong_for_test"))
    row = outcome.rows[0]
    assert row.status == "error" and "wrong result" in row.message and "latency_us" not in row.metrics


def test_a_failing_case_does_not_stop_the_run(tmp_path, write_testlist):
    path = write_testlist([gemm(m=1), gemm(m=2), gemm(m=3)])
    outcome = run_testlist(_config(tmp_path, path, backend="crash_for_test"))
    assert [r.status for r in outcome.rows] == ["ok", "error", "ok"]
    assert "device fault" in outcome.rows[1].message


def test_an_op_the_backend_lacks_is_unsupported(tmp_path, write_testlist):
    outcome = run_testlist(_config(tmp_path, write_testlist([moe()]), backend="wrong_for_test"))
    assert outcome.rows[0].status == "unsupported" and "has no moe op" in outcome.rows[0].message


def test_a_case_that_escapes_the_runner_is_its_own_row(tmp_path, write_testlist, monkeypatch):
    """Even in this process (inline), a BaseException out of one case ends that case only."""
    import operatorx.run.case as case_mod

    path = write_testlist([gemm(m=1, n=64, k=64), gemm(m=2, n=64, k=64), gemm(m=3, n=64, k=64)])
    real = case_mod.CaseRunner.run

    def run(self, case, index):
        if index == 1:
            raise KeyboardInterrupt
        return real(self, case, index)

    monkeypatch.setattr(case_mod.CaseRunner, "run", run)
    outcome = run_testlist(_config(tmp_path, path))
    assert [(r.status, r.error_kind) for r in outcome.rows] == [("ok", None), ("error", "crashed"), ("ok", None)]
    assert "KeyboardInterrupt" in outcome.rows[1].message
    doc = Store(str(tmp_path / "ox.db")).document("latest")
    assert doc["run"]["state"] == "finished" and len(doc["rows"]) == 3


class _BadRelease:
    """Release fails on m == 2; metadata holds a value JSON cannot encode (a torch dtype)."""

    name, op_type = "bad_release_for_test", "gemm"

    def supports(self, case, device):
        return None

    def prepare(self, case, device):
        import torch

        def release():
            if case.args.m == 2:
                raise RuntimeError("release failed (planted)")

        return Prepared(fn=lambda: None, check=lambda: Check(0.0, 0.01, 1, "planted"),
                        metadata={"dtype": torch.bfloat16}, release=release)


register_backend("bad_release_for_test", "gemm", _BadRelease)


def test_a_failing_release_is_that_case_error_and_the_run_goes_on(tmp_path, write_testlist):
    path = write_testlist([gemm(m=1), gemm(m=2), gemm(m=3)])
    outcome = run_testlist(_config(tmp_path, path, backend="bad_release_for_test"))
    assert [r.status for r in outcome.rows] == ["ok", "error", "ok"]
    assert "release failed" in outcome.rows[1].message
    assert outcome.rows[1].metrics["latency_us"] > 0          # the timing is kept beside the error
    assert outcome.rows[0].metrics["backend_meta"]["dtype"] == "torch.bfloat16"
    assert Store(str(tmp_path / "ox.db")).row_count(outcome.run_id) == 3


@pytest.mark.gpu
def test_cuda_run_declares_how_each_number_was_taken(tmp_path, write_testlist):
    """The default CUDA path end to end: kernel spans, verified L2 state, telemetry, profile, trace."""
    path = write_testlist([gemm(m=16, n=2048, k=2048)])
    timing = TimingSettings(warmup_calls=2, warmup_floor_s=0, first_warmup_floor_s=0, max_time_s=0.3)
    config = RunConfig(testlist=str(path), device="cuda", db=str(tmp_path / "ox.db"), results_dir=tmp_path / "res",
                       timing=timing, trace_dir=tmp_path / "traces", executor="inline")
    outcome = run_testlist(config)
    row = outcome.rows[0]
    m = row.metrics
    assert row.status == "ok", row.message
    assert m["method"] == "cupti_kernels" and m["l2_state"] == "cold_clean" and m["l2_verified"] is True
    assert m["summary_us"]["n"] >= 10 and m["noise"] is not None and m["stop_reason"] in ("noise_target", "time_cap")
    assert m["telemetry"]["available"] and m["telemetry"]["readings"] >= 1 and m["telemetry"]["attempts"]
    kernels = m["profile"]["kernels"]
    assert kernels and all("grid" in k and "registers_per_thread" in k for k in kernels)
    trace = json.loads((tmp_path / "traces" / f"{outcome.run_id}-case00000.json").read_text())
    assert any(e.get("name") == "ox.call" for e in trace["traceEvents"])
    assert m["case_seconds"]["timing"] > 0
    # the worker's launch-gap level (Kineto's records here: --trace), on the row and with the run's workers
    assert 0.3 < m["timing"]["launch_gap_us"] < 3.0
    workers = Store(str(tmp_path / "ox.db")).run_info(outcome.run_id)["workers"]
    assert [w["launch_gap"]["boundaries"] for w in workers.values()] == [120]
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert not [k for k in m if f"`{k}`" not in doc], "docs/metrics.md must name every key of a CUDA row"


class _TupleKeyMeta:
    """User code's metadata with a tuple key: JSON cannot encode it as a key."""

    name, op_type = "tuple_key_meta_for_test", "gemm"

    def supports(self, case, device):
        return None

    def prepare(self, case, device):
        return Prepared(fn=lambda: None, check=lambda: Check(0.0, 0.01, 1, "planted"),
                        metadata={"tiles": {(128, 128): "ok"}})


register_backend("tuple_key_meta_for_test", "gemm", _TupleKeyMeta)


def test_metadata_with_a_key_json_cannot_encode_is_stored_not_raised(tmp_path, write_testlist):
    outcome = run_testlist(_config(tmp_path, write_testlist([gemm(), gemm(m=8)]), backend="tuple_key_meta_for_test"))
    assert [r.status for r in outcome.rows] == ["ok", "ok"]
    assert outcome.rows[0].metrics["backend_meta"]["tiles"] == {"(128, 128)": "ok"}
    assert Store(str(tmp_path / "ox.db")).row_count(outcome.run_id) == 2


def test_a_profile_that_fails_after_timing_keeps_the_timing(tmp_path, write_testlist, monkeypatch):
    """What fails after a case was timed (trace export, the kernel breakdown, the ncu replay) is said
    beside the row; the measured number stays."""
    from operatorx.platform import DeviceInfo
    from operatorx.run import case as case_module

    path = write_testlist([gemm(m=2, n=64, k=64)])
    real_measure = case_module.CaseRunner._measure

    def as_if_cuda(self, case, prepared, index, placements=None):   # timed on the CPU, profiled "on CUDA"
        cpu = self.device
        self.device = DeviceInfo(**{**cpu.__dict__, "kind": "cuda"})
        try:
            return real_measure(self, case, prepared, index, placements)
        finally:
            self.device = cpu

    def broken_profile(self, prepared, m, index):
        raise OSError("No space left on device")

    monkeypatch.setattr(case_module.CaseRunner, "_measure", as_if_cuda)
    monkeypatch.setattr(case_module.CaseRunner, "_profile", broken_profile)
    row = run_testlist(_config(tmp_path, path)).rows[0]
    assert row.status == "ok" and row.metrics["latency_us"] > 0
    assert row.metrics["profile_error"] == "OSError: No space left on device"


def test_every_metrics_key_a_row_carries_is_named_in_docs_metrics(tmp_path, write_testlist):
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text(encoding="utf-8")
    path = write_testlist([gemm(m=2, n=64, k=64)])
    row = run_testlist(_config(tmp_path, path)).rows[0]
    missing = [k for k in row.metrics if f"`{k}`" not in doc]
    assert not missing, f"docs/metrics.md does not name {missing}"


def test_rows_stored_together_fall_back_to_one_by_one_and_a_refused_row_stays_in_the_document(tmp_path,
                                                                                             monkeypatch):
    from operatorx.run.sweep import _close
    from operatorx.store import StoreError
    from tests.store.conftest import done

    store, reporter, sink, finished = _sink(tmp_path, 3)
    finished = [replace(f, slot=f"gpu{f.task.index % 2}") for f in finished]
    together: list[int] = []
    real_put_rows = store.put_rows
    monkeypatch.setattr(store, "put_rows",
                        lambda run_id, rows: together.append(len(rows)) or real_put_rows(run_id, rows))
    sink.cases_finished([finished[0], finished[2]])       # two at once: one transaction
    assert together == [2] and store.unfinished("r") == [1]

    def refuse(run_id, rows):
        raise StoreError("database is locked")

    real_put_row = store.put_row

    def put_row(run_id, row):
        if row.case_index == 1:
            raise StoreError("value out of range")
        real_put_row(run_id, row)

    monkeypatch.setattr(store, "put_rows", refuse)
    monkeypatch.setattr(store, "put_row", put_row)
    sink.cases_finished(finished)                         # the group fails: each alone, row 1 refused
    assert store.unfinished("r") == [1] and list(sink.unstored) == [done(1).key()]
    assert reporter.done == [("gpu0", 0), ("gpu0", 2), ("gpu0", 0), ("gpu1", 1), ("gpu0", 2)]
    assert len(reporter.notes) == 1 and "row of case 1 not stored (value out of range)" in reporter.notes[0]
    # the run's document holds the refused row; the outcome counts it without validating every row
    outcome = _close(sink.spec, store, "finished", sink.unstored)
    assert outcome.unstored == 1
    assert outcome.count("ok") == 3 and "rows" not in outcome.__dict__            # not validated yet
    saved = json.loads(outcome.document_path.read_text())
    assert [d["status"] for d in saved["rows"]] == ["ok"] * 3 and saved["run"]["unstored_rows"] == 1
    assert [r.case_index for r in outcome.rows] == [0, 1, 2] and outcome.rows[1].status == "ok"


def _sink(tmp_path, n: int):
    from operatorx.run.job import JobSpec
    from operatorx.run.scheduler import FinishedCase, Task
    from operatorx.run.sweep import _Sink
    from operatorx.run.worker_process import CaseOutcome
    from tests.store.conftest import done, planned

    store = Store(str(tmp_path / "ox.db"))
    store.begin_run("r", "2026-12-01T00:00:00", "t", "torch", "cpu", {}, planned(n))
    reporter = Notes()
    sink = _Sink(JobSpec(config=_config(tmp_path, "t"), run_id="r", testlist="t"), store, reporter)
    finished = [FinishedCase("gpu0", Task(index=i, case=done(i).case), CaseOutcome(index=i, row=done(i).to_json()))
                for i in range(n)]
    return store, reporter, sink, finished


def test_a_failing_database_is_not_tried_row_by_row_for_the_whole_group(tmp_path, monkeypatch):
    """Locked or unreachable: each try waits out the store's retries, so after two single rows fail
    one after another the rest of the group goes to the document untried."""
    from operatorx.store import StoreError

    store, reporter, sink, finished = _sink(tmp_path, 6)
    tries: list[int] = []

    def locked(run_id, rows):
        raise StoreError("database is locked")

    def locked_row(run_id, row):
        tries.append(row.case_index)
        raise StoreError("database is locked")

    monkeypatch.setattr(store, "put_rows", locked)
    monkeypatch.setattr(store, "put_row", locked_row)
    sink.cases_finished(finished)
    assert tries == [0, 1] and len(sink.unstored) == 6 and len(reporter.done) == 6
    # kept in the run's rows file beside its document, written as they were refused (store/unstored.py)
    assert reporter.notes[-1] == ("4 more row(s) not tried: the database failed 2 rows in a row; they are kept in "
                                  f"{tmp_path / 'res' / 'r.unstored.jsonl'}")


def test_a_row_from_the_worker_that_does_not_validate_is_its_case_error_and_the_others_are_stored(tmp_path):
    store, reporter, sink, finished = _sink(tmp_path, 3)
    finished[1].outcome.row = {**finished[1].outcome.row, "status": "finished-ish"}
    sink.cases_finished(finished)
    rows = store.rows("r")
    assert [r.status for r in rows] == ["ok", "error", "ok"] and store.unfinished("r") == []
    assert rows[1].error_kind == "exception" and rows[1].message.startswith(
        "exception: the worker's row did not validate: ")


def test_a_cpu_row_names_its_host_clock_and_no_l2_state(tmp_path, write_testlist):
    """On the CPU the host clock times the call: rows and the run say `host_clock`, and claim no L2 flush
    or device timer mode they never applied."""
    outcome = run_testlist(_config(tmp_path, write_testlist([gemm(m=2, n=64, k=64)])))
    timing = outcome.rows[0].metrics["timing"]
    assert timing["mode"] == "host_clock" and timing["l2_state"] == "n/a (cpu)" and "spin_cycles" not in timing
    doc = json.loads(outcome.document_path.read_text())
    assert doc["run"]["timing"]["mode"] == "host_clock" and "l2_state" not in doc["run"]["timing"]


def test_a_cpu_case_with_many_gb_of_weights_is_unsupported_with_the_number(tmp_path, write_testlist):
    """5.2 GB of bf16 weights and 5.2 GFLOP: under the FLOP guard, over the bytes one (a CPU takes tens of
    seconds a call on such a case, and the machine's load decided between ok and a timeout)."""
    outcome = run_testlist(_config(tmp_path, write_testlist([gemm(m=1, n=40000, k=65536), gemm(m=2, n=64, k=64)])))
    big, small = outcome.rows
    assert big.status == "unsupported" and small.status == "ok"
    assert big.message == ("CPU device: 5.2 GB moved per call exceeds cpu_max_gb=4 (weights this large take tens "
                           "of seconds a call on a CPU)")
    again = run_testlist(_config(tmp_path, write_testlist([gemm(m=2, n=64, k=64)], name="b.json"), cpu_max_gb=1e-6))
    assert again.rows[0].status == "unsupported" and "cpu_max_gb=1e-06" in again.rows[0].message
