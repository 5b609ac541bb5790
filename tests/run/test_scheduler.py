"""The scheduler hands a local worker its next case ahead, and takes it back whenever the worker
will not start it: the worker ended with the case before, or the run is stopping. Fake slots, no
processes: what is checked is which case ran where, and that every case ends exactly once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from operatorx.run.scheduler import FINISHED_PER_CALL, FinishedCase, Scheduler, SendsAhead, Task
from operatorx.run.worker_process import CaseOutcome
from operatorx.spec import Case
from tests.conftest import gemm


def _tasks(n: int) -> list[Task]:
    return [Task(index=i, case=Case.model_validate(gemm(m=i + 1))) for i in range(n)]


@dataclass
class FakeSlot:
    """A worker that runs the cases it was sent in order. `crash_on` ends its worker (as a
    segfault would): whatever was sent after that case is lost with it."""

    name: str
    crash_on: set[int] = field(default_factory=set)
    stop_after: Optional[threading.Event] = None
    """Set this event when the first case ends (a SIGTERM arriving mid-run)."""
    refuse_ahead: set[int] = field(default_factory=set)
    """Sending these ahead raises (and sending them to an idle worker does not)."""
    worker: Optional[int] = field(default=None, init=False)
    queue: list[int] = field(default_factory=list, init=False)
    ran: list[tuple[int, int]] = field(default_factory=list, init=False)
    """(worker number, case index) of every case a worker started."""
    after: Optional[threading.Event] = None
    """A case ends only once this is set (and clears it): the parent has taken the last row in."""
    sent_ahead: int = field(default=0, init=False)
    workers_started: int = field(default=0, init=False)

    def ensure_worker(self) -> dict[str, Any]:
        if self.worker is None:
            self.workers_started += 1
            self.worker, self.queue = self.workers_started, []
        return {}

    def send_case(self, index: int, case: Case, ahead: bool = False) -> bool:
        if self.worker is None:
            return False
        if ahead and index in self.refuse_ahead:
            raise ValueError(f"case {index} cannot be encoded ahead")
        assert ahead == bool(self.queue), "a case is sent ahead exactly when its worker is busy"
        if self.queue:
            self.sent_ahead += 1
        self.queue.append(index)
        return True

    def await_case(self, index: int, deadline_s: float, stop: threading.Event) -> CaseOutcome:
        assert self.worker is not None and self.queue[0] == index, (self.queue, index)
        self.queue.pop(0)
        if self.after is not None:
            assert self.after.wait(10)
            self.after.clear()
        self.ran.append((self.worker, index))
        if self.stop_after is not None:
            self.stop_after.set()
        if index in self.crash_on:
            self.crash_on.discard(index)            # a fresh worker runs it fine
            self.worker, self.queue = None, []
            return CaseOutcome(index=index, failure="crashed", worker_replaced=True, detail="segfault")
        return CaseOutcome(index=index, row={"status": "ok"})

    def run(self, index: int, case: Case, deadline_s: float, stop: threading.Event) -> CaseOutcome:
        raise AssertionError("a slot that sends ahead is driven by send_case/await_case")

    def kill(self) -> None:
        self.worker, self.queue = None, []

    def close(self) -> None:
        self.kill()


class Events:
    def __init__(self) -> None:
        self.finished: list[tuple[int, Optional[str]]] = []

    def worker_ready(self, slot: str, info: dict[str, Any]) -> None: ...
    def case_started(self, slot: str, task: Task) -> None: ...
    def slot_failed(self, slot: str, message: str) -> None: ...

    def cases_finished(self, finished: list[FinishedCase]) -> None:
        self.finished += [(f.task.index, f.outcome.failure) for f in finished]


def test_a_local_slot_is_sent_its_next_case_while_it_runs_one():
    slot, events = FakeSlot("gpu0"), Events()
    assert isinstance(slot, SendsAhead)
    Scheduler([slot], _tasks(6), deadline_s=10, grace_s=1, events=events).run()
    assert [i for _, i in slot.ran] == [0, 1, 2, 3, 4, 5]
    assert sorted(events.finished) == [(i, None) for i in range(6)]
    # ahead while more cases wait than there are slots: after 0..4 are sent, one case is left
    assert slot.sent_ahead == 4


def test_the_case_sent_ahead_is_given_back_when_the_worker_dies_and_runs_once_in_a_fresh_one():
    slot, events = FakeSlot("gpu0", crash_on={2}), Events()
    Scheduler([slot], _tasks(6), deadline_s=10, grace_s=1, events=events).run()
    # case 3 was sent to worker 1 behind case 2; worker 1 died with case 2 before starting it, so 3
    # runs once, in worker 2; case 2 is tried once more in a fresh worker (a crash may be the worker's)
    assert slot.ran[:3] == [(1, 0), (1, 1), (1, 2)]
    assert sorted(slot.ran[3:]) == [(2, 2), (2, 3), (2, 4), (2, 5)]
    assert sorted(events.finished) == [(i, None) for i in range(6)]
    assert slot.workers_started == 2


def test_a_stopping_run_takes_back_the_case_sent_ahead_and_leaves_it_unrun():
    stop = threading.Event()
    slot, events = FakeSlot("gpu0", stop_after=stop), Events()
    scheduler = Scheduler([slot], _tasks(5), deadline_s=10, grace_s=1, events=events)
    scheduler.stop = stop
    scheduler.run()
    assert slot.ran == [(1, 0)]                 # case 1 was sent ahead, never started
    assert events.finished == [(0, None)]
    assert [t.index for t in scheduler.unrun] == [1, 2, 3, 4]
    assert scheduler.interrupted


def test_near_the_end_no_case_is_sent_ahead_so_none_waits_behind_a_busy_worker():
    slots = [FakeSlot("gpu0"), FakeSlot("gpu1")]
    events = Events()
    Scheduler(slots, _tasks(3), deadline_s=10, grace_s=1, events=events).run()
    assert sum(s.sent_ahead for s in slots) == 0        # 3 cases, 2 slots: never more waiting than slots
    assert sorted(i for s in slots for _, i in s.ran) == [0, 1, 2]


def test_a_case_that_fails_to_be_sent_ahead_is_not_charged_to_the_running_one():
    slot, events = FakeSlot("gpu0", refuse_ahead={2}), Events()
    Scheduler([slot], _tasks(5), deadline_s=10, grace_s=1, events=events).run()
    assert sorted(events.finished) == [(i, None) for i in range(5)]     # case 1 ran while 2 failed to go ahead
    assert [i for _, i in slot.ran] == [0, 1, 2, 3, 4] and slot.workers_started == 1


class _ClosingSlot:
    """A slot whose close waits for every other slot's close to have begun (a barrier): it can
    only return when all are closing at once."""

    def __init__(self, name: str, barrier: threading.Barrier, fail: bool = False) -> None:
        self.name, self.barrier, self.fail, self.closed = name, barrier, fail, False

    def close(self) -> None:
        self.barrier.wait()
        self.closed = True
        if self.fail:
            raise RuntimeError(f"{self.name}: could not stop")


def test_the_workers_are_stopped_all_at_once_and_a_failure_is_still_raised():
    import pytest

    from operatorx.run.scheduler import _close_all

    barrier = threading.Barrier(3, timeout=10)
    slots = [_ClosingSlot(f"gpu{i}", barrier) for i in range(3)]
    _close_all(slots)  # type: ignore[arg-type]
    assert all(s.closed for s in slots)
    barrier = threading.Barrier(2, timeout=10)
    slots = [_ClosingSlot("gpu0", barrier, fail=True), _ClosingSlot("gpu1", barrier)]
    with pytest.raises(RuntimeError, match="gpu0: could not stop"):
        _close_all(slots)  # type: ignore[arg-type]
    assert all(s.closed for s in slots)


class SlowEvents(Events):
    """A store that takes its time over the first rows (a database's commit): the rows that finish
    meanwhile wait for the calling thread, and must reach it together, in order, each once."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[int]] = []
        self.order: list[str] = []
        self.running: set[int] = set()
        self.running_beside_ends: list[set[int]] = []
        self.busy: Callable[[], None] = lambda: time.sleep(0.3)

    def case_started(self, slot: str, task: Task) -> None:
        self.order.append(f"started {task.index}")
        self.running.add(task.index)

    def cases_finished(self, finished: list[FinishedCase]) -> None:
        if not self.calls:
            self.busy()                           # the fake workers finish cases meanwhile
        done = {f.task.index for f in finished}
        # one slot runs one case at a time: none but these may be told as running now, or a progress
        # display would end on "idle" while the next case runs (told before the end of the one before)
        self.running_beside_ends.append(self.running - done)
        self.running -= done
        self.calls.append([f.task.index for f in finished])
        self.order += [f"finished {f.task.index}" for f in finished]
        super().cases_finished(finished)


def test_rows_that_finish_while_the_store_is_busy_are_handed_over_together():
    n = FINISHED_PER_CALL + 20
    events = SlowEvents()
    slot = FakeSlot("gpu0")

    def until_every_case_ran() -> None:      # however slow the machine: the backlog is all there
        deadline = time.monotonic() + 30
        while len(slot.ran) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)                     # its last `finished` queued after its start

    events.busy = until_every_case_ran
    Scheduler([slot], _tasks(n), deadline_s=10, grace_s=1, events=events).run()
    assert sorted(events.finished) == [(i, None) for i in range(n)]            # each case once
    assert max(len(c) for c in events.calls) == FINISHED_PER_CALL              # the backlog, bounded
    assert [i for c in events.calls for i in c] == list(range(n))              # one slot: in its order
    # every case is told as started before it is told as finished, and a case still running is told
    # after the ends handed over with it
    assert all(events.order.index(f"started {i}") < events.order.index(f"finished {i}") for i in range(n))
    assert all(not r for r in events.running_beside_ends), events.running_beside_ends


def test_a_case_still_running_is_told_after_the_ends_handed_over_with_it():
    """A slot queues case 0's end, then case 1's start; case 2 started and ended in the same group.
    Told: 2's start before its end, and 1's start after 0's end (a progress display ends on 1)."""
    from operatorx.run.scheduler import _Event

    events = SlowEvents()
    events.calls.append([])
    tasks = _tasks(3)
    scheduler = Scheduler([FakeSlot("gpu0")], tasks, deadline_s=10, grace_s=1, events=events)
    ok = {i: CaseOutcome(index=i, row={"status": "ok"}) for i in range(3)}
    ended = scheduler._handle([_Event("finished", "gpu0", tasks[0], ok[0]), _Event("started", "gpu0", tasks[1]),
                               _Event("started", "gpu1", tasks[2]), _Event("finished", "gpu1", tasks[2], ok[2]),
                               _Event("slot_done", "gpu1")])
    assert ended == 1 and events.calls[1:] == [[0, 2]]
    assert events.order == ["started 2", "finished 0", "finished 2", "started 1"]


def test_a_row_that_arrives_alone_is_handed_over_alone_at_once():
    taken = threading.Event()
    taken.set()

    class Keeping(SlowEvents):
        def cases_finished(self, finished: list[FinishedCase]) -> None:
            super().cases_finished(finished)
            taken.set()

    events = Keeping()
    events.calls.append([])                         # no slow first call: a store that keeps up
    # each case ends only once the parent has taken the last row in: rows arrive one at a time
    Scheduler([FakeSlot("gpu0", after=taken)], _tasks(8), deadline_s=10, grace_s=1, events=events).run()
    assert events.calls[1:] == [[i] for i in range(8)]
