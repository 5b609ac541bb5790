"""Multi-rank cases in the scheduler, with fake slots and a fake gang runner (no processes): a W-rank
case gets W slots at once; the slots it gathers, and every other slot, keep running single-rank
cases while it waits; a split's cases reuse one gang; a stop gives a forming gang's case back."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from operatorx.run.ranks.placement import place
from operatorx.run.scheduler import FinishedCase, Scheduler, Task, most_on_one_host
from operatorx.run.worker_process import CaseOutcome
from operatorx.spec import Case
from tests.conftest import gemm

SINGLE_S = 0.1
GANG_S = 0.3


@dataclass
class Clock:
    """Busy intervals (start, end, what) of every slot, on one monotonic clock."""
    t0: float = field(default_factory=time.monotonic)
    busy: dict[str, list[tuple[float, float, str]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, slot: str, start: float, end: float, what: str) -> None:
        with self.lock:
            self.busy.setdefault(slot, []).append((start - self.t0, end - self.t0, what))


@dataclass
class TimedSlot:
    """A slot whose worker takes SINGLE_S per case (no send-ahead: the scheduler calls `run`)."""
    name: str
    clock: Clock
    worker: Any = None
    env: dict[str, str] = field(default_factory=dict)

    def ensure_worker(self) -> dict[str, Any]:
        self.worker = self.worker or object()
        return {}

    def run(self, index: int, case: Case, deadline_s: float, stop: threading.Event) -> CaseOutcome:
        start = time.monotonic()
        time.sleep(SINGLE_S)
        self.clock.add(self.name, start, time.monotonic(), f"single {index}")
        return CaseOutcome(index=index, row={"status": "ok"})

    def kill(self) -> None:
        self.worker = None

    def close(self) -> None:
        self.worker = None


@dataclass
class FakeGangs:
    """Runs a gang's case for GANG_S on all its members at once; records who ran what."""
    clock: Clock
    ran: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)
    dissolved: list[tuple[str, ...]] = field(default_factory=list)

    def run(self, members: list[TimedSlot], task: Task, deadline_s: float, stop: threading.Event,
            on_ready: Any) -> CaseOutcome:
        start = time.monotonic()
        time.sleep(GANG_S)
        for m in members:
            self.clock.add(m.name, start, time.monotonic(), f"gang {task.index}")
        self.ran.append((task.index, tuple(m.name for m in members)))
        return CaseOutcome(index=task.index, row={"status": "ok"})

    def dissolve(self, members: list[TimedSlot]) -> None:
        self.dissolved.append(tuple(m.name for m in members))


class Events:
    def __init__(self) -> None:
        self.finished: list[FinishedCase] = []

    def worker_ready(self, slot: str, info: dict[str, Any]) -> None: ...
    def case_started(self, slot: str, task: Task) -> None: ...
    def slot_failed(self, slot: str, message: str) -> None: ...

    def cases_finished(self, finished: list[FinishedCase]) -> None:
        self.finished.extend(finished)


def _split(m: int, tp: int) -> Case:
    return Case.model_validate({**gemm(m=m, n=128, k=128, parallel={"tp": tp}), "sources": ["org/x/mlp.down_proj"]})


def _tasks(multi: list[Case], singles: int) -> list[Task]:
    tasks = [Task(index=i, case=c) for i, c in enumerate(multi)]
    tasks += [Task(index=len(multi) + j, case=Case.model_validate(gemm(m=j + 1))) for j in range(singles)]
    ordered, refused = place(tasks, rank_local=False, executor="local", device_kind="cpu", workers=3, ab=False)
    assert not refused
    return ordered


def _run(slots: list[TimedSlot], tasks: list[Task], gangs: FakeGangs) -> Events:
    events = Events()
    Scheduler(slots, tasks, deadline_s=30, grace_s=1, events=events, gangs=gangs).run()  # type: ignore[arg-type]
    return events


def test_a_gang_gets_two_slots_at_once_and_no_slot_idles_while_it_waits():
    clock = Clock()
    slots = [TimedSlot(f"cpu{i}", clock) for i in range(3)]
    gangs = FakeGangs(clock)
    events = _run(slots, _tasks([_split(2, 2)], singles=12), gangs)
    assert sorted(f.task.index for f in events.finished) == list(range(13))       # every case once
    ((index, members),) = gangs.ran
    assert index == 0 and len(set(members)) == 2
    gang_start = min(s for name in members for s, _, w in clock.busy[name] if w == "gang 0")
    gang_end = max(e for name in members for _, e, w in clock.busy[name] if w == "gang 0")
    # both members held the gang's case at the same time
    spans = [next((s, e) for s, e, w in clock.busy[name] if w == "gang 0") for name in members]
    assert abs(spans[0][0] - spans[1][0]) < 0.05 and abs(spans[0][1] - spans[1][1]) < 0.05
    # the slot outside the gang ran single-rank cases while the gang waited and while it ran
    (other,) = {s.name for s in slots} - set(members)
    singles_beside = [(s, e) for s, e, w in clock.busy[other] if w.startswith("single") and s < gang_end]
    assert len(singles_beside) >= int((gang_end - 0.05) / SINGLE_S) - 1
    # before the gang filled, its first member ran a single-rank case rather than wait: the only idle
    # time is the last member's wait for its partner's current case (at most one single case)
    for name in members:
        before = [(s, e) for s, e, w in clock.busy[name] if e <= gang_start + 0.01]
        idle = gang_start - sum(e - s for s, e in before)
        assert idle <= SINGLE_S + 0.08, (name, idle, clock.busy[name])
    # no slot idled while single-rank cases were still queued: the singles ended back to back
    last_single_start = max(s for b in clock.busy.values() for s, _, w in b if w.startswith("single"))
    for name, intervals in clock.busy.items():
        ordered = sorted(intervals)
        gaps = [b[0] - a[1] for a, b in zip(ordered, ordered[1:], strict=False) if b[0] <= last_single_start]
        assert all(g <= SINGLE_S + 0.08 for g in gaps), (name, ordered)


def test_a_splits_cases_reuse_one_gang_and_another_split_gets_its_own():
    clock = Clock()
    slots = [TimedSlot(f"cpu{i}", clock) for i in range(3)]
    gangs = FakeGangs(clock)
    events = _run(slots, _tasks([_split(2, 2), _split(3, 3), _split(4, 2)], singles=2), gangs)
    assert sorted(f.task.index for f in events.finished) == list(range(5))
    by_index = dict(gangs.ran)
    assert by_index[0] == by_index[2]                 # the two tp2 cases: one gang, one after the other
    assert len(by_index[1]) == 3                      # tp3: every slot
    tp2_order = [i for i, _ in gangs.ran if i in (0, 2)]
    assert tp2_order == [0, 2] and gangs.ran.index((2, by_index[2])) == gangs.ran.index((0, by_index[0])) + 1
    assert sorted(map(len, gangs.dissolved)) == [2, 3]     # each gang dissolved once, after its split's cases


def test_a_case_needing_more_workers_than_the_run_has_is_refused_with_the_count():
    tasks = [Task(0, _split(2, 4)), Task(1, Case.model_validate(gemm()))]
    ordered, refused = place(tasks, rank_local=False, executor="local", device_kind="cpu", workers=2, ab=False)
    assert [t.index for t in ordered] == [1]
    ((task, why),) = refused
    assert task.index == 0 and why == "needs tp·dp = 4 workers of one host; this run has 2 (--workers 2)"
    _, refused = place(tasks, rank_local=False, executor="local", device_kind="cuda", workers=2, ab=False)
    assert refused[0][1] == "needs tp·dp = 4 GPUs of one host; this run has 2"
    fresh = [Task(0, _split(2, 4))]
    ordered, refused = place(fresh, rank_local=False, executor="ray", device_kind="cuda", workers=4, ab=False)
    assert not refused and ordered[0].world == 4                  # ray: `workers` is the largest node's slots
    _, refused = place(tasks, rank_local=False, executor="ray", device_kind="cpu", workers=3, ab=False)
    assert refused[0][1] == ("needs tp·dp = 4 CPU workers of one Ray node; this run has 3 on its largest node "
                             "(one slot per CPU of a node, by Ray's resources)")
    ordered, refused = place(tasks, rank_local=True, executor="local", device_kind="cpu", workers=1, ab=False)
    assert not refused and all(t.world == 1 for t in ordered)       # --rank-local: one worker times the shard


def test_a_gang_that_cannot_fill_ends_as_a_failure_saying_why():
    clock = Clock()
    slots = [TimedSlot(f"cpu{i}", clock) for i in range(2)]
    gangs = FakeGangs(clock)
    tasks = _tasks([_split(2, 3)], singles=1)
    events = _run(slots, tasks, gangs)                  # (placement would refuse it; here a slot died)
    by_index = {f.task.index: f.outcome for f in events.finished}
    assert by_index[0].failure == "crashed" and "only 2 worker(s)" in by_index[0].detail
    assert by_index[1].row == {"status": "ok"} and not gangs.ran


@dataclass
class HostSlot(TimedSlot):
    """A slot of a named host (a Ray actor pinned to a node)."""

    host: str = ""


def test_a_gang_gathers_on_one_host_and_a_case_no_host_can_hold_ends_saying_so():
    """Slots of two hosts, listed so that the first two free slots are of different hosts: the tp2 gang
    still gathers both of host a's slots; the host b slot runs single-rank cases meanwhile. With one
    slot per host, no gang can gather: the case ends with the count, the singles all run."""
    clock = Clock()
    slots = [HostSlot("a0", clock, host="a"), HostSlot("b0", clock, host="b"), HostSlot("a1", clock, host="a")]
    gangs = FakeGangs(clock)
    events = _run(slots, _tasks([_split(2, 2), _split(3, 2)], singles=6), gangs)   # type: ignore[arg-type]
    assert sorted(f.task.index for f in events.finished) == list(range(8))
    assert sorted(gangs.ran) == [(0, ("a0", "a1")), (1, ("a0", "a1"))] or \
        sorted(gangs.ran) == [(0, ("a1", "a0")), (1, ("a1", "a0"))]
    assert any(w.startswith("single") for _, _, w in clock.busy["b0"])
    apart = [HostSlot("a0", clock, host="a"), HostSlot("b0", clock, host="b")]
    gangs = FakeGangs(clock)
    events = _run(apart, _tasks([_split(2, 2)], singles=3), gangs)   # type: ignore[arg-type]
    by_index = {f.task.index: f.outcome for f in events.finished}
    assert by_index[0].failure == "crashed"
    assert by_index[0].detail == "of a 2-rank case: only 1 worker(s) on one host could start"
    assert all(by_index[i].row == {"status": "ok"} for i in (1, 2, 3)) and not gangs.ran


def test_the_largest_gang_a_run_can_gather_is_its_fullest_host_within_what_the_host_holds():
    clock = Clock()
    assert most_on_one_host([TimedSlot("cpu0", clock), TimedSlot("cpu1", clock)]) == 2
    slots = [HostSlot("a0", clock, host="a"), HostSlot("b0", clock, host="b"), HostSlot("a1", clock, host="a")]
    assert most_on_one_host(slots) == 2

    @dataclass
    class Roomy(HostSlot):
        host_room: int = 1                             # a node that holds one slot at once

    assert most_on_one_host([Roomy("a0", clock, host="a"), Roomy("a1", clock, host="a"),
                             HostSlot("b0", clock, host="b")]) == 1


@dataclass
class DeadSlot(TimedSlot):
    """A slot whose worker never starts: it gives its cases back and ends (as a GPU that cannot start)."""

    def ensure_worker(self) -> dict[str, Any]:
        raise RuntimeError("no worker here")


def test_a_multi_rank_case_left_with_too_few_live_workers_ends_and_the_run_finishes():
    """A worker that cannot start leaves one slot: the 2-rank case can never gather, and ends as a
    failure with the count instead of holding the run forever; the single-rank cases all run."""
    clock = Clock()
    slots = [DeadSlot("cpu0", clock), TimedSlot("cpu1", clock)]
    gangs = FakeGangs(clock)
    tasks = _tasks([_split(2, 2)], singles=4)
    events = Events()
    runner = threading.Thread(target=Scheduler(slots, tasks, deadline_s=30, grace_s=1, events=events,
                                               gangs=gangs).run)  # type: ignore[arg-type]
    runner.start()
    runner.join(20)
    assert not runner.is_alive()
    by_index = {f.task.index: f.outcome for f in events.finished}
    assert sorted(by_index) == [0, 1, 2, 3, 4]
    assert by_index[0].failure == "crashed" and by_index[0].detail == "of a 2-rank case: only 1 worker(s) could start"
    assert all(by_index[i].row == {"status": "ok"} for i in (1, 2, 3, 4)) and not gangs.ran


def test_a_full_gang_whose_member_ends_before_sitting_down_lets_the_others_go():
    """A member that joined, then ended while starting a worker for a single-rank case (the gang filled
    meanwhile): the member already seated does not wait forever, and the case waits again."""
    from operatorx.run.scheduler import _Gang

    clock = Clock()
    gone, seated = TimedSlot("cpu0", clock), TimedSlot("cpu1", clock)
    spare = TimedSlot("cpu2", clock)                      # two slots still live: the case can gather again
    tasks = _tasks([_split(2, 2)], singles=0)
    scheduler = Scheduler([gone, seated, spare], tasks, deadline_s=30, grace_s=1, events=Events(),
                          gangs=FakeGangs(clock))  # type: ignore[arg-type]
    task = scheduler._pending.popleft()
    scheduler._in_flight += 1
    gang = _Gang(task, members=[gone, seated])            # full: both joined
    scheduler._member_of = {"cpu0": gang, "cpu1": gang}
    scheduler._active[task.split] = 1
    sitter = threading.Thread(target=scheduler._sit, args=(gang,))
    sitter.start()
    scheduler._serve_slot = lambda slot: None             # type: ignore[method-assign]  # cpu0 ends at once
    scheduler._slot_loop(gone)
    sitter.join(5)
    assert not sitter.is_alive() and gang.done
    assert [t.index for t in scheduler.unrun] == [task.index] and scheduler._in_flight == 0
    assert scheduler._member_of == {} and scheduler._active[task.split] == 0


@dataclass
class StoppedGangs(FakeGangs):
    """A gang case that runs until the run is stopped (SIGTERM), then ends interrupted."""

    def run(self, members: list[TimedSlot], task: Task, deadline_s: float, stop: threading.Event,
            on_ready: Any) -> CaseOutcome:
        assert stop.wait(10)
        return CaseOutcome(index=task.index, failure="interrupted", worker_replaced=True)


def test_a_stop_while_a_gang_runs_leaves_its_case_missing_and_dissolves_the_gang():
    clock = Clock()
    slots = [TimedSlot(f"cpu{i}", clock) for i in range(2)]
    gangs = StoppedGangs(clock)
    events = Events()
    scheduler = Scheduler(slots, _tasks([_split(2, 2), _split(3, 2)], singles=2), deadline_s=30, grace_s=1,
                          events=events, gangs=gangs)  # type: ignore[arg-type]
    threading.Timer(0.5, scheduler.stop.set).start()
    scheduler.run()
    assert scheduler.interrupted
    assert not [f for f in events.finished if f.task.index == 0]    # interrupted: stays missing for --resume
    # the gang's first member ran single 2 while its partner came; the split's next case (1) and the
    # last single (3) never started: still waiting, for --resume
    assert [f.task.index for f in events.finished] == [2]
    assert {t.index for t in scheduler.unrun} == {1, 3}
    assert gangs.dissolved == [("cpu0", "cpu1")] or gangs.dissolved == [("cpu1", "cpu0")]


def _formed_on_a_with_a1(slots: list[HostSlot], ended: set[str], singles: int) -> tuple[Scheduler, Events, FakeGangs]:
    """A scheduler whose 2-rank case (index 0) is gathering a gang on host a with a1 seated in it;
    the slots named in `ended` end at once (their worker lost: they never join a gang)."""
    from operatorx.run.scheduler import _Gang

    clock = Clock()
    gangs = FakeGangs(clock)
    events = Events()
    scheduler = Scheduler(slots, _tasks([_split(2, 2)], singles=singles), deadline_s=30, grace_s=1, events=events,
                          gangs=gangs)  # type: ignore[arg-type]
    task = scheduler._pending.popleft()
    assert task.index == 0 and task.world == 2
    scheduler._in_flight += 1
    a1 = next(s for s in slots if s.name == "a1")
    gang = _Gang(task, host="a", members=[a1])
    scheduler._forming, scheduler._member_of = gang, {"a1": gang}
    serve = scheduler._serve_slot
    scheduler._serve_slot = lambda slot: None if slot.name in ended else serve(slot)  # type: ignore[method-assign]
    return scheduler, events, gangs


def _run_within(scheduler: Scheduler, seconds: float) -> None:
    runner = threading.Thread(target=scheduler.run)
    runner.start()
    runner.join(seconds)
    assert not runner.is_alive(), "the run did not end"


def test_a_gang_that_cannot_fill_on_its_host_runs_on_another_host_that_still_can():
    """Host a loses a worker while a 2-rank case gathers there; host b has two idle workers: the case
    waits again and runs on b's two slots, not ended as too few workers."""
    clock = Clock()
    slots = [HostSlot("a0", clock, host="a"), HostSlot("a1", clock, host="a"),
             HostSlot("b0", clock, host="b"), HostSlot("b1", clock, host="b")]
    scheduler, events, gangs = _formed_on_a_with_a1(slots, ended={"a0"}, singles=2)
    _run_within(scheduler, 20)
    by_index = {f.task.index: f for f in events.finished}
    assert sorted(f.task.index for f in events.finished) == [0, 1, 2]       # every case once
    assert by_index[0].outcome.row == {"status": "ok"} and by_index[0].outcome.failure is None
    ((index, members),) = gangs.ran
    assert index == 0 and sorted(members) == ["b0", "b1"]
    assert not [f for f in events.finished if "worker(s)" in f.outcome.detail]
    assert all(by_index[i].outcome.row == {"status": "ok"} for i in (1, 2))


def test_a_gang_no_host_can_fill_any_more_ends_once_with_the_count():
    """Host a loses a worker while the case gathers there, and host b loses one too: no host has two
    live slots, so the case ends as one failure row with the count (it may wait again for b first,
    while b still had two), the single-rank cases all run, and the run ends."""
    clock = Clock()
    slots = [HostSlot("a0", clock, host="a"), HostSlot("a1", clock, host="a"),
             HostSlot("b0", clock, host="b"), HostSlot("b1", clock, host="b")]
    scheduler, events, gangs = _formed_on_a_with_a1(slots, ended={"a0", "b1"}, singles=3)
    _run_within(scheduler, 20)
    rows = [f for f in events.finished if f.task.index == 0]
    assert len(rows) == 1
    assert rows[0].outcome.failure == "crashed"
    assert rows[0].outcome.detail == "of a 2-rank case: only 1 worker(s) on one host could start"
    assert not gangs.ran and not scheduler.unrun
    assert sorted(f.task.index for f in events.finished) == [0, 1, 2, 3]
    assert all(f.outcome.row == {"status": "ok"} for f in events.finished if f.task.index != 0)


def test_a_case_put_back_waits_again_only_while_a_host_can_hold_it():
    """The rule of `_wait_again`, on one host: a case handed back while two slots live is first in line
    again; once only one lives it ends at once with the count; while stopping it stays missing."""
    clock = Clock()
    for live, stopping, waits in ((2, False, True), (1, False, False), (1, True, True)):
        scheduler = Scheduler([TimedSlot(f"cpu{i}", clock) for i in range(3)], _tasks([_split(2, 2)], singles=0),
                              deadline_s=30, grace_s=1, events=Events(), gangs=FakeGangs(clock))  # type: ignore[arg-type]
        task = scheduler._pending.popleft()
        scheduler._in_flight += 1
        scheduler._live_at[""] = live
        if stopping:
            scheduler.stop.set()
        with scheduler._lock:
            scheduler._wait_again(task)
        queued = [scheduler._events.get_nowait() for _ in range(scheduler._events.qsize())]
        if waits:
            assert [t.index for t in scheduler.unrun] == [0] and scheduler._in_flight == 0 and not queued
        else:
            assert not scheduler.unrun and scheduler._in_flight == 1        # its finished event ends it
            ((event,),) = [queued]
            assert event.kind == "finished" and event.outcome is not None
            assert event.outcome.detail == "of a 2-rank case: only 1 worker(s) could start"
