"""How the W answers of a multi-rank case become its one outcome (run/ranks/gang.combine): the rank
that died or hung is named, not the ranks that failed waiting for it."""

from __future__ import annotations

from operatorx.run.ranks.gang import RankAnswer, combine
from operatorx.run.worker_process import CaseOutcome

ROW = {"status": "ok", "error_kind": None, "metrics": {"latency_us": 5.0}}


def _answered(rank: int, status: str = "ok", message: str = "", kind: str = "", row: dict | None = None,
              replace: bool = False, killed: bool = False) -> RankAnswer:
    result = {"rank": rank, "status": status, "message": message or None, "error_kind": kind or None, "broken": False}
    return RankAnswer(rank, f"cpu{rank}", CaseOutcome(index=7, row=row, rank_result=result, worker_replaced=replace),
                      killed=killed)


def _failed(rank: int, failure: str, detail: str, killed: bool = False) -> RankAnswer:
    return RankAnswer(rank, f"cpu{rank}", CaseOutcome(index=7, failure=failure, detail=detail, worker_replaced=True),
                      killed=killed)


def test_every_rank_ok_is_rank_zeros_row_and_the_group_is_kept():
    out = combine([_answered(1), _answered(0, row=ROW)], world=2, index=7, stopping=False)
    assert out.row == ROW and out.failure is None and not out.worker_replaced


def test_a_dead_rank_is_named_not_the_rank_that_lost_its_peer():
    out = combine([_answered(0, "error", "rank 0 of 2: RuntimeError: Connection closed by peer", "exception",
                             row={**ROW, "status": "error"}),
                   _failed(1, "crashed", "killed by signal SIGKILL\nstderr tail")], world=2, index=7, stopping=False)
    assert out.failure == "crashed" and out.worker_replaced
    assert out.detail.splitlines()[0] == "of rank 1 of 2 (cpu1) killed by signal SIGKILL"
    assert out.detail.splitlines()[1] == "stderr tail"


def test_a_killed_straggler_is_not_taken_for_the_cause_of_a_death():
    out = combine([_failed(0, "crashed", "killed by signal SIGKILL", killed=True),
                   _failed(1, "oom", "killed by signal SIGKILL: the OOM killer's count rose")],
                  world=2, index=7, stopping=False)
    assert out.failure == "oom" and out.detail.startswith("rank 1 of 2 (cpu1): killed by signal SIGKILL")


def test_a_silent_rank_is_a_timeout_naming_it():
    out = combine([_answered(0, "error", "rank 0 of 2: RuntimeError: Application timeout caused pair closure",
                             "exception", row={**ROW, "status": "error"}),
                   _failed(1, "timeout", "no row after 8 s (--case-timeout)")], world=2, index=7, stopping=False)
    assert out.failure == "timeout"
    first = out.detail.splitlines()[0]
    assert first.startswith("rank 1 (cpu1) of 2 gave no answer (no row after 8 s")
    assert "the others failed waiting for it: rank 0 of 2: RuntimeError: Application timeout" in first


def test_an_error_every_rank_agreed_on_is_rank_zeros_row():
    said = "rank 1 of 2: ValueError: no kernel"
    row = {**ROW, "status": "error", "error_kind": "exception", "message": said}
    out = combine([_answered(0, "error", said, "exception", row=row), _answered(1, "error", said, "exception")],
                  world=2, index=7, stopping=False)
    assert out.row == row and out.failure is None


def test_a_rank_that_leaked_after_the_case_turns_the_row_into_its_error_and_replaces_the_workers():
    out = combine([_answered(0, row=ROW), _answered(1, "error", "host memory grew by 3000 MiB", "leak", replace=True)],
                  world=2, index=7, stopping=False)
    assert out.row["status"] == "error" and out.row["error_kind"] == "leak"
    assert out.row["message"] == "rank 1 of 2: host memory grew by 3000 MiB" and out.worker_replaced


def test_a_stopped_run_leaves_the_case_interrupted():
    out = combine([_failed(0, "interrupted", ""), _answered(1)], world=2, index=7, stopping=True)
    assert out.failure == "interrupted"
