"""Multi-rank cases on the CPU for real: W worker processes form one gloo group per split, every rank
times each iteration behind a barrier, and the row is the slowest rank's, checked against the whole
layer's fp32 reference. Faults are injected into one rank (run/ranks/faults.py)."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time

import pytest

from operatorx.measure import TimingSettings
from operatorx.run import RunConfig, run_testlist
from operatorx.run.ranks.faults import FAULT_ENV
from operatorx.store import Store
from tests.conftest import BF16, gemm, moe

FAST = TimingSettings(warmup_calls=1, warmup_floor_s=0, first_warmup_floor_s=0, min_samples=3, max_samples=8,
                      max_time_s=0)
SLOWER = TimingSettings(warmup_calls=1, warmup_floor_s=0, first_warmup_floor_s=0, min_samples=3, max_samples=16,
                        max_time_s=0)
SLEEP_S = 0.03


def _config(tmp_path, testlist, workers, **kw):
    return RunConfig(testlist=str(testlist), device="cpu", db=str(tmp_path / "ox.db"), results_dir=tmp_path / "res",
                     timing=kw.pop("timing", FAST), workers=workers, **kw)


def _tp(m: int, n: int, k: int, tp: int, role: str) -> dict:
    return {**gemm(m=m, n=n, k=k, parallel={"tp": tp}), "sources": [f"org/model/{role}"]}


def _moe(parallel: dict, **over) -> dict:
    case = moe(**over)
    case["args"]["parallel"] = parallel
    return case


def _singles(n: int, m: int = 2, k: int = 64) -> list[dict]:
    return [gemm(m=m, n=64 + 8 * i, k=k) for i in range(n)]


def _check_rank_numbers(row, world: int) -> None:
    """latency_us, latency_us_min and skew_us are what the per-rank samples say, iteration by iteration."""
    ranks = row.ranks
    assert ranks is not None and ranks.world == world and len(ranks.per_rank) == world
    assert [p.rank for p in ranks.per_rank] == list(range(world))
    columns = list(zip(*(p.samples_us for p in ranks.per_rank), strict=True))
    assert len(columns) == ranks.iterations == len(row.samples_us) >= 3
    assert row.samples_us == pytest.approx([max(c) for c in columns])
    assert row.latency_us == pytest.approx(statistics.median(max(c) for c in columns))
    assert ranks.latency_us_min == pytest.approx(statistics.median(min(c) for c in columns))
    assert ranks.skew_us == pytest.approx(statistics.median(max(c) - min(c) for c in columns))
    for p in ranks.per_rank:
        assert p.latency_us == pytest.approx(statistics.median(p.samples_us))
        assert p.busy_us is None and p.collective_us is None and p.gpu is None    # CPU: no kernels, no GPU
    assert ranks.kernel_times.startswith("none: the CPU device runs no kernels")
    assert ranks.barrier == "gloo all_reduce of one element"


@pytest.fixture(scope="module")
def slow_rank_run(tmp_path_factory):
    """Three workers: tp2 gemm (column and row), tp2 and dp2·ep2 moe, and single-rank cases; rank 1's
    timed call sleeps SLEEP_S after the op."""
    tmp_path = tmp_path_factory.mktemp("ranks")
    cases = [_tp(8, 128, 256, 2, "mlp.gate_up_proj"), _tp(8, 128, 512, 2, "mlp.down_proj"), _moe({"tp": 2}),
             _moe({"dp": 2, "ep": 2}), *_singles(16, m=256, k=512)]
    path = tmp_path / "list.json"
    path.write_text(json.dumps(cases))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(FAULT_ENV, f"1:sleep_in_call:{SLEEP_S}")
        outcome = run_testlist(_config(tmp_path, path, workers=3, timing=SLOWER))
    return tmp_path, outcome


def test_tp_gemm_and_tp_and_ep_moe_are_ok_checked_and_timed_over_their_ranks(slow_rank_run):
    tmp_path, outcome = slow_rank_run
    column, row, moe_tp, moe_ep = outcome.rows[:4]
    for r in (column, row, moe_tp, moe_ep):
        assert r.status == "ok", r.message
        assert r.check is not None and r.check.ok and 0 < r.check.rel_error <= r.check.bound
        assert "combined over 2 ranks" in r.check.reference
        _check_rank_numbers(r, 2)
    assert [r.ranks.split for r in (column, row, moe_tp, moe_ep)] == ["tp2", "tp2", "tp2", "dp2·ep2"]
    assert column.extra["split"] == "column" and column.extra["rank_share"] == "n 0:64 of 128"
    assert column.ranks.collectives == ["all_gather_single (gloo)"]
    assert row.extra["split"] == "row" and row.ranks.collectives == ["all_reduce (gloo)"]
    assert moe_tp.extra["split"] == "tp" and moe_ep.extra["split"] == "dp·ep"
    assert moe_ep.ranks.collectives == ["all_to_all_single (splits, then rows; gloo)"]
    assert moe_ep.extra["rank_experts"] == 4
    # rates are the whole group's work: a dp2 layer computes both ranks' batches
    assert column.rates.flops == 2 * 8 * 128 * 256
    assert moe_ep.rates.flops == 2 * moe_tp.rates.flops
    doc = json.loads(outcome.document_path.read_text())
    stored = doc["rows"][3]["metrics"]["ranks"]
    assert stored["world"] == 2 and stored["split"] == "dp2·ep2" and len(stored["per_rank"]) == 2
    assert Store(str(tmp_path / "ox.db")).row_count(outcome.run_id) == len(doc["rows"])


def test_a_slow_rank_shows_as_skew_and_sets_the_latency(slow_rank_run):
    _, outcome = slow_rank_run
    for r in outcome.rows[:4]:
        fast, slow = r.ranks.per_rank
        assert slow.latency_us >= SLEEP_S * 1e6 and fast.latency_us < SLEEP_S * 1e6 / 2, r.case.label()
        assert r.latency_us >= SLEEP_S * 1e6 > 2 * r.ranks.latency_us_min
        assert SLEEP_S * 1e6 * 0.7 < r.ranks.skew_us < SLEEP_S * 1e6 * 1.5


def test_single_rank_cases_run_beside_a_multi_rank_case_on_the_other_worker(slow_rank_run):
    _, outcome = slow_rank_run
    assert all(r.status == "ok" and r.ranks is None for r in outcome.rows[4:])
    # no single-rank case waited for the multi-rank ones: each started before the last of them ended
    # (while the gang formed and ran, on the worker outside it and on the members until it filled).
    # How the ranks' slots share the time is tests/run/test_ranks_scheduler.py's, with fake slots.
    last_multi_end = max(r.case_seconds.started_unix_s + r.case_seconds.total for r in outcome.rows[:4])
    late = [r.case_index for r in outcome.rows[4:] if r.case_seconds.started_unix_s >= last_multi_end]
    assert not late, late


def test_tp4_runs_over_four_workers_and_more_than_the_host_has_is_refused(tmp_path, write_testlist):
    path = write_testlist([_tp(4, 128, 512, 4, "self_attn.o_proj"), _tp(4, 128, 512, 8, "self_attn.o_proj"),
                           *_singles(1)])
    outcome = run_testlist(_config(tmp_path, path, workers=4))
    tp4, tp8, single = outcome.rows
    assert tp4.status == "ok" and tp4.check.ok, tp4.message
    _check_rank_numbers(tp4, 4)
    assert tp4.extra["rank_share"] == "k 0:128 of 512"
    assert tp8.status == "unsupported" and tp8.ranks is None
    assert tp8.message == "needs tp·dp = 8 workers of one host; this run has 4 (--workers 4)"
    assert single.status == "ok"


def test_a_late_rank_before_its_barrier_is_not_measured_and_unbuilt_splits_say_why(tmp_path, write_testlist,
                                                                                     monkeypatch):
    """The barrier absorbs a rank that reaches it late: launch skew is not timed. In the same run, splits
    the torch backend does not build are refused by its ranks, with why."""
    monkeypatch.setenv(FAULT_ENV, f"1:sleep_before_barrier:{SLEEP_S}")
    path = write_testlist([_tp(8, 128, 256, 2, "mlp.gate_up_proj"), _tp(8, 192, 256, 2, "lm_head"),
                           _moe({"tp": 2}, experts={"num": 8, "top_k": 2, "inter": 120, "w1": BF16, "w2": BF16})])
    row, vocab, uneven = run_testlist(_config(tmp_path, path, workers=2)).rows
    assert row.status == "ok", row.message
    _check_rank_numbers(row, 2)
    assert row.latency_us < SLEEP_S * 1e6 / 2 and row.ranks.skew_us < SLEEP_S * 1e6 / 2
    assert vocab.status == "unsupported" and vocab.message.startswith("rank 0 of 2: vocab-parallel")
    assert uneven.status == "unsupported" and "inter=60 is not a multiple of 8" in uneven.message


def test_a_rank_killed_mid_case_is_one_error_row_naming_it_and_the_sweep_finishes(tmp_path, write_testlist,
                                                                                   monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "1:kill_in_timing")
    path = write_testlist([_tp(8, 128, 256, 2, "mlp.gate_up_proj"), *_singles(1)])
    outcome = run_testlist(_config(tmp_path, path, workers=2))
    assert outcome.state == "finished" and len(outcome.rows) == 2
    split, single = outcome.rows
    assert split.status == "error" and split.error_kind == "crashed"
    assert split.message.startswith("crashed: the worker of rank 1 of 2 (cpu")
    assert "killed by signal SIGKILL (tried 2 times)" in split.message      # a fresh pair of workers tried it again
    assert len(split.failures) == 2 and all("rank 1 of 2" in f for f in split.failures)
    assert single.status == "ok"


def test_a_hung_rank_is_a_timeout_naming_it(tmp_path, write_testlist, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "1:hang_in_timing")
    path = write_testlist([_tp(8, 128, 256, 2, "mlp.gate_up_proj"), *_singles(1)])
    outcome = run_testlist(_config(tmp_path, path, workers=2, case_timeout_s=8))
    split, single = outcome.rows
    assert split.status == "error" and split.error_kind == "timeout"
    assert split.message.startswith("timeout: rank 1 (cpu") and "gave no answer" in split.message
    assert single.status == "ok" and outcome.state == "finished"


def test_sigterm_stops_multi_rank_cases_and_resume_finishes_them(tmp_path, write_testlist):
    """SIGTERM: the case in flight over two workers ends `interrupted` (stays missing), the run is
    `interrupted`; `--resume` runs exactly the cases left, over fresh groups, each once."""
    cases = [_tp(8, 128, 256 + 64 * i, 2, "mlp.down_proj") for i in range(6)]
    path = write_testlist(cases)
    db = tmp_path / "ox.db"
    env = {**os.environ, FAULT_ENV: "1:sleep_in_call:0.05"}       # each case takes about a second
    common = ["--db", str(db), "--results-dir", str(tmp_path / "res")]
    proc = subprocess.Popen([sys.executable, "-m", "operatorx", "run", "-t", str(path), "--device", "cpu",
                             "--workers", "2", "--min-samples", "3", "--warmup-calls", "1", "--max-time", "0",
                             "--grace", "5", *common], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120:
        try:
            with Store(str(db), create=False) as reading:
                runs = reading.list_runs()
        except Exception:  # noqa: BLE001 - the database may be half-created yet
            runs = []
        if runs and sum(n for s, n in runs[0]["counts"].items() if s != "missing") >= 1:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    with Store(str(db), create=False) as reading:        # closed before the resume writes
        run_id = reading.resolve_run("latest")
    doc = json.loads((tmp_path / "res" / f"{run_id}.json").read_text())
    assert doc["run"]["state"] == "interrupted" and f"operatorx run --resume {run_id}" in out
    statuses = [r["status"] for r in doc["rows"]]
    assert "missing" in statuses and statuses.count("ok") >= 1 and "error" not in statuses
    done = subprocess.run([sys.executable, "-m", "operatorx", "run", "--resume", run_id, *common],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    with Store(str(db), create=False) as reading:
        rows = reading.rows(run_id)
    assert sorted((r.case_index, r.status) for r in rows) == [(i, "ok") for i in range(6)]
    assert all(r.ranks is not None and r.ranks.world == 2 for r in rows)


def test_graph_timing_is_refused_for_multi_rank_cases_on_cuda_with_what_to_use():
    from operatorx.backends import get_backend
    from operatorx.run.ranks.rank_runner import GRAPH_REFUSAL, _refusal
    from operatorx.spec import Case

    raw = gemm(m=8, n=256, k=256)
    raw["args"]["parallel"] = {"tp": 2}
    raw["sources"] = ["org/model/mlp.gate_up_proj"]
    case = Case.model_validate(raw)
    backend = get_backend("torch", "gemm")
    why = _refusal(case, backend, "torch", "cuda", 1e9, 1e9, 2, "graph")
    assert why == GRAPH_REFUSAL and "--timing kernels" in why
    assert _refusal(case, backend, "torch", "cuda", 1e9, 1e9, 2, "kernels") is None
    assert _refusal(case, backend, "torch", "cpu", 1e9, 1e9, 2, "graph") is None   # the CPU runs the host clock
