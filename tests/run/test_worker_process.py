"""A case sent ahead waits in the worker's stdin behind the case before it: its deadline must
count from its own `started`, not from when the parent wrote it (messages fed to the reader's
inbox by hand; no process)."""

from __future__ import annotations

import io
import threading
import time

from operatorx.run.config import RunConfig
from operatorx.run.job import JobSpec
from operatorx.run.protocol import WorkerMessage
from operatorx.run.worker_process import AHEAD_MAX_BYTES, WorkerProcess
from operatorx.spec import Case
from tests.conftest import gemm


class _Running:
    """Stands in for the Popen of a worker that stays alive."""

    pid = -1

    def __init__(self) -> None:
        self.stdin = io.StringIO()

    def poll(self) -> None:
        return None


def _worker() -> WorkerProcess:
    spec = JobSpec(config=RunConfig(testlist="t.yaml", device="cpu"), run_id="r", testlist="t.yaml")
    worker = WorkerProcess(spec=spec, env={}, name="w0")
    worker.proc = _Running()            # type: ignore[assignment]
    return worker


def _feed(worker: WorkerProcess, after_s: float, kind: str, **body: object) -> None:
    def put() -> None:
        time.sleep(after_s)
        worker._inbox.put(WorkerMessage(kind=kind, body=dict(body)))
    threading.Thread(target=put, daemon=True).start()


def test_the_deadline_of_a_case_sent_ahead_starts_when_the_worker_starts_it():
    worker = _worker()
    _feed(worker, 1.0, "started", index=7)          # the case before it ran 1 s
    _feed(worker, 1.5, "row", index=7, row={"status": "ok"})
    outcome = worker.await_case(7, deadline_s=1.2, stop=threading.Event())
    assert outcome.failure is None and outcome.row == {"status": "ok"}
    assert 0.3 < outcome.seconds < 1.0               # from its start (1.0 s) to its row (1.5 s)


def test_a_case_that_never_answers_after_its_start_times_out():
    worker = _worker()
    killed: list[bool] = []
    worker.kill = lambda: killed.append(True)      # type: ignore[method-assign]
    _feed(worker, 0.2, "started", index=3)
    t0 = time.monotonic()
    outcome = worker.await_case(3, deadline_s=0.6, stop=threading.Event())
    assert outcome.failure == "timeout" and outcome.worker_replaced and killed == [True]
    assert 0.75 < time.monotonic() - t0 < 2.0       # 0.6 s counted from the start at 0.2 s


def test_a_case_too_long_for_the_pipe_is_not_sent_ahead_but_is_sent_to_an_idle_worker():
    worker = _worker()
    small = Case.model_validate(gemm(m=1))
    big = Case.model_validate({**gemm(m=2), "metadata": {"blob": "x" * AHEAD_MAX_BYTES}})
    assert worker.send_case(0, small, ahead=True)
    assert not worker.send_case(1, big, ahead=True)
    lines = worker.proc.stdin.getvalue().splitlines()       # type: ignore[union-attr]
    assert len(lines) == 1 and '"index": 0' in lines[0]
    assert worker.send_case(1, big)                          # the worker is reading: any size goes
    assert len(worker.proc.stdin.getvalue().splitlines()) == 2    # type: ignore[union-attr]
