"""Hand the cases of a run to slots (one per GPU, CPU share or Ray actor), as each slot frees up.

Never a fixed split: a slot takes the next case when it is done with its last, so a slow GPU or
a long case does not hold the others back. A local worker is handed one case ahead (it waits in
the worker's stdin), so the worker starts it the moment the last one ends instead of waiting for
the parent's round trip. Near the end of the run, when no more cases wait than there are slots,
none is sent ahead, so the last cases do not queue behind a long one while another GPU is idle (a
case sent ahead earlier can still wait behind its worker's current one).

The scheduler decides what a failure means for the case (retry it in a fresh worker, or give it
its final `error` row) and hands the final rows to `events.cases_finished` in the calling thread,
which owns the store. Cases that finished while that thread was busy with the last ones are handed
over together (up to `FINISHED_PER_CALL`), so the store can commit them in one transaction: with
many GPUs or a Ray cluster the rows arrive faster than a database commits them one by one
(bench/parent_rows.py), and a parent that falls behind holds finished rows that a kill would lose.
A row that arrives alone is still handed over alone, at once.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Protocol, runtime_checkable

from operatorx.run.faults import KILLS_ALLOWED, RETRIED_KINDS
from operatorx.run.worker_process import CaseOutcome

if TYPE_CHECKING:
    from operatorx.run.ranks.gang import GangRunner
    from operatorx.spec import Case

__all__ = ["Task", "SlotLike", "host_of", "most_on_one_host", "SendsAhead", "Scheduler", "SchedulerEvents",
           "FinishedCase", "FINISHED_PER_CALL"]

FINISHED_PER_CALL = 64
"""At most this many finished cases in one `cases_finished` call."""


@dataclass
class Task:
    index: int
    case: Case
    kills: int = 0
    """Workers this case has killed (timeouts, crashes, poisoned contexts, OOMs)."""
    failures: list[str] = field(default_factory=list)
    world: int = 1
    """Workers the case runs on at once: tp·dp of a multi-rank case (run/ranks/), else 1."""
    split: str = ""
    """A multi-rank case's split label (`tp2`): cases of one split share a group of workers."""


class SlotLike(Protocol):
    """A slot may also name its host (`host`: a Ray actor is pinned to a node); slots without one are
    all of the parent's host. A gang's members are slots of one host (`host_of`)."""

    name: str

    def ensure_worker(self) -> dict[str, Any]: ...
    def run(self, index: int, case: Case, deadline_s: float, stop: threading.Event) -> CaseOutcome: ...
    def kill(self) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class SendsAhead(Protocol):
    """A slot whose worker can be handed its next case while it runs the current one (local
    workers: the case waits in the worker's stdin). Ray actors and the inline slot cannot."""

    def send_case(self, index: int, case: Case, ahead: bool = False) -> bool: ...
    def await_case(self, index: int, deadline_s: float, stop: threading.Event) -> CaseOutcome: ...


def host_of(slot: object) -> str:
    """The host a slot's worker runs on ("" for the parent's own): the W members of a gang share one,
    since a group's rendezvous and its Ray placement group are one node's (run/ranks/)."""
    return str(getattr(slot, "host", "") or "")


def most_on_one_host(slots: Sequence[object]) -> int:
    """The most slots of one host that can run at once (a slot may say how many its host holds,
    `host_room`: a Ray node's GPUs or CPUs): the largest gang this run can gather."""
    counts: dict[str, int] = {}
    room: dict[str, int] = {}
    for slot in slots:
        counts[host_of(slot)] = counts.get(host_of(slot), 0) + 1
        held = getattr(slot, "host_room", None)
        if held is not None:
            room[host_of(slot)] = int(held)
    return max((min(n, room.get(h, n)) for h, n in counts.items()), default=0)


@dataclass(frozen=True)
class FinishedCase:
    """A case's final outcome, with the slot that ran it."""
    slot: str
    task: Task
    outcome: CaseOutcome


class SchedulerEvents(Protocol):
    def worker_ready(self, slot: str, info: dict[str, Any]) -> None: ...
    def case_started(self, slot: str, task: Task) -> None: ...
    def cases_finished(self, finished: list[FinishedCase]) -> None: ...
    def slot_failed(self, slot: str, message: str) -> None: ...


@dataclass(eq=False)
class _Gang:
    """The slots a multi-rank case gathers (rank r on members[r]). It fills as slots free up; a member
    takes single-rank cases meanwhile (nothing idles while the gang waits for others), and stops
    taking them once the gang is full; the last member to sit down leads it: it runs the case, then
    the split's next cases on the same workers, and dissolves the gang."""
    task: Task
    host: str = ""
    """The host of every member (`host_of`)."""
    members: list[SlotLike] = field(default_factory=list)
    seated: int = 0
    done: bool = False

    @property
    def full(self) -> bool:
        return len(self.members) >= self.task.world


@dataclass
class _Event:
    kind: str                      # ready, started, finished, slot_failed, slot_done
    slot: str
    task: Optional[Task] = None
    outcome: Optional[CaseOutcome] = None
    info: Optional[dict[str, Any]] = None
    message: str = ""


class Scheduler:
    """Runs `tasks` on `slots`; `events` sees everything in the calling thread."""

    def __init__(self, slots: Sequence[SlotLike], tasks: list[Task], deadline_s: float, grace_s: float,
                 events: SchedulerEvents, retried_kinds: frozenset[str] = RETRIED_KINDS,
                 gangs: Optional[GangRunner] = None) -> None:
        self.slots, self.deadline_s, self.grace_s, self.events = list(slots), deadline_s, grace_s, events
        self.retried_kinds = retried_kinds
        self.gangs = gangs
        """Runs the multi-rank tasks (world > 1) on gangs of slots; None: every task is single-rank."""
        self._forming: Optional[_Gang] = None
        self._member_of: dict[str, _Gang] = {}
        self._active: dict[str, int] = {}
        """Full gangs of each split, running or about to."""
        self._live_at: dict[str, int] = {}
        """Live slots on each host (`host_of`): a gang gathers on one host."""
        self._room_at: dict[str, int] = {}
        """How many slots each host holds at once, where its slots say (`host_room`: a Ray node's GPUs or CPUs)."""
        for slot in self.slots:
            self._live_at[host_of(slot)] = self._live_at.get(host_of(slot), 0) + 1
            room = getattr(slot, "host_room", None)
            if room is not None:
                self._room_at[host_of(slot)] = int(room)
        self._pending: deque[Task] = deque(tasks)
        self._lock = threading.Condition()
        self._in_flight = 0
        self._done = not tasks
        self.stop = threading.Event()
        """Set to hand out no new case (SIGINT/SIGTERM); cases in flight get `grace_s`."""
        self._events: queue.Queue[_Event] = queue.Queue()
        self.stopped_at: Optional[float] = None
        self.interrupted = False

    # --- slot threads -------------------------------------------------------------------------
    def _pop(self, multi: bool) -> Optional[Task]:
        """The first waiting task that is multi-rank (`multi`) or single-rank, taken (under the lock)."""
        for i, task in enumerate(self._pending):
            if (task.world > 1 and self.gangs is not None) == multi:
                del self._pending[i]
                self._in_flight += 1
                return task
        return None

    def _take(self, slot: SlotLike) -> Optional[Task | _Gang]:
        """This slot's next work: a single-rank task, or its full gang to sit down in; None to end.

        A free slot joins the gang that is forming (or starts one for the first multi-rank task
        waiting), then takes single-rank tasks until its gang is full."""
        with self._lock:
            while True:
                gang = self._member_of.get(slot.name)
                if gang is not None and gang.full:
                    return gang                    # sit down even when stopping: its leader gives the case back
                if self._done or self.stop.is_set():
                    if gang is not None:
                        self._leave(gang, slot)
                    return None
                if gang is None:
                    host = host_of(slot)
                    if self._forming is None:
                        task = self._pop_for_new_gang(host)
                        if task is not None:
                            self._forming = _Gang(task, host=host)
                    gang = self._forming if self._forming is not None and self._forming.host == host else None
                    if gang is not None:
                        gang.members.append(slot)
                        self._member_of[slot.name] = gang
                        if gang.full:
                            self._forming = None
                            self._active[gang.task.split] = self._active.get(gang.task.split, 0) + 1
                        self._lock.notify_all()
                        continue
                if gang is not None and gang.task.world > self._usable(gang.host):
                    self._abandon(gang)
                    continue
                single = self._pop(multi=False)
                if single is not None:
                    return single
                self._end_unrunnable()
                self._lock.wait(0.2)

    def _pop_for_new_gang(self, host: str) -> Optional[Task]:
        """The first waiting multi-rank case a new gang on `host` should gather for (under the lock).
        Not one of a split whose running gangs will take every waiting case of it next: those run on
        the workers that already hold the split's group, where a new gang would cost a group and fresh
        workers; and none that needs more of the host's slots than its full gangs leave (it could only
        fill from theirs)."""
        waiting: dict[str, int] = {}
        for task in self._pending:
            if task.world > 1:
                waiting[task.split] = waiting.get(task.split, 0) + 1
        held = sum(len(g.members) for g in set(self._member_of.values()) if g.full and not g.done and g.host == host)
        for i, task in enumerate(self._pending):
            if task.world > 1 and self.gangs is not None and waiting[task.split] > self._active.get(task.split, 0) \
                    and self._usable(host) - held >= task.world:
                del self._pending[i]
                self._in_flight += 1
                return task
        return None

    def _leave(self, gang: _Gang, slot: SlotLike) -> None:
        """A slot that stops or ended leaves a gang that is not full; the last to leave hands its case
        on (`_wait_again`) (under the lock)."""
        gang.members.remove(slot)
        self._member_of.pop(slot.name, None)
        if not gang.members:
            if self._forming is gang:
                self._forming = None
            self._wait_again(gang.task)

    def _abandon(self, gang: _Gang) -> None:
        """Fewer slots live on the gang's host than it needs (a worker there could not start): the gang
        is let go and its case handed on (`_wait_again`): another host may still hold it (under the lock)."""
        for member in gang.members:
            self._member_of.pop(member.name, None)
        if self._forming is gang:
            self._forming = None
        self._wait_again(gang.task)

    def _wait_again(self, task: Task) -> None:
        """A multi-rank case taken for a gang that will not run it: first in line again while some host
        still has `task.world` live slots (or the run is stopping: it stays missing), else it ends with
        the count (under the lock).

        It always ends: a gang gathers only on a host with `world` live slots its full gangs do not hold
        (`_pop_for_new_gang`) and is let go only once fewer live there (`_abandon`) or a member ended
        (`_disband`, `_leave`; or the run is stopping), so every time a case waits again a slot has
        ended; slots end once and none start, so a case waits again at most once per slot of the run
        before it runs or ends with the count (here, or in `_end_unrunnable` once no host can hold it)."""
        if self.stop.is_set() or task.world <= self._most_live():
            self._in_flight -= 1
            self._pending.appendleft(task)
        else:
            self._events.put(self._too_few_workers(task))     # still in flight: its finished event ends it
        self._lock.notify_all()

    def _end_unrunnable(self) -> None:
        """Waiting multi-rank cases that need more slots than are still live end as failures (under the
        lock): no gang could ever gather for them, and the run would wait for them forever."""
        if self.gangs is None:
            return
        for task in [t for t in self._pending if t.world > self._most_live()]:
            self._pending.remove(task)
            self._in_flight += 1
            self._events.put(self._too_few_workers(task))

    def _usable(self, host: str) -> int:
        """Live slots of `host` that can run at once (its `host_room` caps them; as `most_on_one_host`)."""
        live = self._live_at.get(host, 0)
        return min(live, self._room_at.get(host, live))

    def _most_live(self) -> int:
        """The most live slots on one host (under the lock): the largest gang that can still gather."""
        return max((self._usable(host) for host in self._live_at), default=0)

    def _too_few_workers(self, task: Task) -> _Event:
        where = " on one host" if len(self._live_at) > 1 else ""
        outcome = CaseOutcome(index=task.index, failure="crashed", worker_replaced=False,
                              detail=f"of a {task.world}-rank case: only {self._most_live()} worker(s){where} "
                                     "could start")
        return _Event("finished", "", task=task, outcome=outcome)

    def _disband(self, gang: _Gang) -> None:
        """A full gang whose member ended before it sat down (its worker could not start): the members
        waiting in it are let go and its case handed on (`_wait_again`) (under the lock)."""
        gang.done = True
        self._active[gang.task.split] -= 1
        for member in gang.members:
            self._member_of.pop(member.name, None)
        self._wait_again(gang.task)

    def _sit(self, gang: _Gang) -> None:
        """Wait in a full gang until every member is free; the last one leads it."""
        with self._lock:
            gang.seated += 1
            if gang.seated < len(gang.members):
                while not gang.done:
                    self._lock.wait(0.2)
                return
        try:
            self._lead(gang)
        finally:
            with self._lock:
                gang.done = True
                self._active[gang.task.split] -= 1
                for member in gang.members:
                    self._member_of.pop(member.name, None)
                self._lock.notify_all()

    def _pop_split(self, split: str, world: int) -> Optional[Task]:
        """The next waiting case of this split and world, for the gang that just ran one."""
        with self._lock:
            if self.stop.is_set():
                return None
            for i, task in enumerate(self._pending):
                if task.world == world and task.split == split:
                    del self._pending[i]
                    self._in_flight += 1
                    return task
        return None

    def _lead(self, gang: _Gang) -> None:
        """Run the gang's case, then the split's next cases on the same workers; then dissolve it."""
        assert self.gangs is not None
        members = gang.members
        label = "+".join(m.name for m in members)
        task: Optional[Task] = gang.task
        try:
            while task is not None:
                if self.stop.is_set():
                    self._give_back(task)
                    break
                for member in members:
                    self._events.put(_Event("started", member.name, task=task))
                try:
                    outcome = self.gangs.run(members, task, self.deadline_s, self.stop,  # type: ignore[arg-type]
                                             lambda name, info: self._events.put(_Event("ready", name, info=info)))
                except BaseException as err:  # noqa: BLE001 - the gang's own failure is this case's row, never a hang
                    outcome = CaseOutcome(index=task.index, failure="crashed", worker_replaced=True,
                                          detail=f"failed in the sweep itself: {type(err).__name__}: {err}")
                self._events.put(_Event("finished", label, task=task, outcome=outcome))
                task = self._pop_split(task.split, task.world)
        finally:
            self.gangs.dissolve(members)  # type: ignore[arg-type]

    def _slot_loop(self, slot: SlotLike) -> None:
        try:
            self._serve_slot(slot)
        finally:
            with self._lock:
                self._live_at[host_of(slot)] -= 1      # first: what its gang's case does next counts it gone
                gang = self._member_of.get(slot.name)
                if gang is not None and not gang.full:
                    self._leave(gang, slot)            # a slot that ended: its forming gang fills without it
                elif gang is not None and not gang.done:
                    self._disband(gang)                # full, but it never sat down: the others would wait forever
                self._lock.notify_all()
            self._events.put(_Event("slot_done", slot.name))

    def _take_ahead(self, slot: SlotLike) -> Optional[Task]:
        """The next single-rank case if one is waiting (never blocks), to send to a worker before it
        needs it; none for a slot a gang holds (it must be free when its gang fills)."""
        with self._lock:
            singles = sum(1 for t in self._pending if t.world <= 1 or self.gangs is None)
            if self._done or self.stop.is_set() or singles <= len(self.slots) or slot.name in self._member_of:
                return None
            return self._pop(multi=False)

    def _give_back(self, task: Task) -> None:
        """A case sent ahead that its worker never started (the worker ended first, or the run is
        stopping): first in line again, nothing counted against it."""
        with self._lock:
            self._in_flight -= 1
            self._pending.appendleft(task)
            self._lock.notify_all()

    def _send_ahead(self, slot: SendsAhead) -> Optional[Task]:
        """Take the next case and hand it to `slot`'s busy worker; the case, or None when there was
        none to take or it was not sent (too long to wait in the pipe, or the worker is gone: it is
        given back). A failure to send is never the running case's."""
        ahead = self._take_ahead(slot)  # type: ignore[arg-type]
        if ahead is None:
            return None
        try:
            sent = slot.send_case(ahead.index, ahead.case, ahead=True)
        except Exception:  # noqa: BLE001 - e.g. a case that will not encode: its own turn reports it
            sent = False
        if not sent:
            self._give_back(ahead)
            return None
        return ahead

    def _serve_slot(self, slot: SlotLike) -> None:
        start_failures = 0
        # sent to the slot's worker, to start as soon as the case before it ends (SendsAhead slots only)
        ahead: Optional[Task] = None
        ahead_slot = slot if isinstance(slot, SendsAhead) else None
        while True:
            work, was_sent = (ahead, True) if ahead is not None else (self._take(slot), False)
            ahead = None
            if work is None:
                break
            if isinstance(work, _Gang):
                self._sit(work)
                continue
            task = work
            if not was_sent:
                try:
                    fresh = getattr(slot, "worker", True) is None
                    info = slot.ensure_worker()
                    if fresh:
                        self._events.put(_Event("ready", slot.name, info=info))
                    start_failures = 0
                except Exception as err:  # noqa: BLE001 - a slot that cannot start a worker gives its case back
                    start_failures += 1
                    self._give_back(task)
                    if start_failures >= 2:
                        self._events.put(_Event("slot_failed", slot.name, message=str(err)))
                        break
                    continue
            self._events.put(_Event("started", slot.name, task=task))
            try:
                if ahead_slot is not None:
                    if not was_sent:
                        ahead_slot.send_case(task.index, task.case)   # a dead worker: await_case says crashed
                    ahead = self._send_ahead(ahead_slot)
                    outcome = ahead_slot.await_case(task.index, self.deadline_s, self.stop)
                else:
                    outcome = slot.run(task.index, task.case, self.deadline_s, self.stop)
            except BaseException as err:  # noqa: BLE001 - the slot's own failure is this case's row, never a hang
                slot.kill()
                outcome = CaseOutcome(index=task.index, failure="crashed", worker_replaced=True,
                                      detail=f"failed in the sweep itself: {type(err).__name__}: {err}")
            if ahead is not None and (outcome.worker_replaced or self.stop.is_set()):
                if not outcome.worker_replaced:
                    slot.kill()          # stopping: the worker would start the case sent ahead
                self._give_back(ahead)
                ahead = None
            self._events.put(_Event("finished", slot.name, task=task, outcome=outcome))

    # --- the calling thread -------------------------------------------------------------------
    def run(self) -> None:
        """Until every task has a final outcome, the stop grace has passed, or no slot is left."""
        threads = [threading.Thread(target=self._slot_loop, args=(s,), daemon=True, name=f"slot-{s.name}")
                   for s in self.slots]
        for t in threads:
            t.start()
        live, killed = len(threads), False
        try:
            while live:
                if self.stop.is_set() and self.stopped_at is None:
                    self.stopped_at = time.monotonic()
                    with self._lock:
                        self._lock.notify_all()
                if not killed and self.stopped_at is not None and time.monotonic() - self.stopped_at > self.grace_s:
                    killed = True
                    for s in self.slots:      # grace is over: the cases in flight end as `interrupted`
                        s.kill()
                try:
                    event = self._events.get(timeout=0.2)
                except queue.Empty:
                    continue
                live -= self._handle(self._with_queued(event))
        finally:
            with self._lock:
                self._done = True
                self._lock.notify_all()
            _close_all(self.slots)
            self.interrupted = self.stop.is_set()

    def _with_queued(self, event: _Event) -> list[_Event]:
        """`event` and those already waiting behind it (never blocks), up to `FINISHED_PER_CALL`
        finished cases."""
        out = [event]
        finished = int(event.kind == "finished")
        while finished < FINISHED_PER_CALL:
            try:
                out.append(self._events.get_nowait())
            except queue.Empty:
                break
            finished += out[-1].kind == "finished"
        return out

    def _handle(self, events: list[_Event]) -> int:
        """Hand `events` on in their order, except that the finished cases among them are told
        together, and a case that started in this group and is still running is told after them: a
        slot queues its case's end before its next case's start, and a progress display must end on
        the running case, not on the one before it. Returns how many slots ended."""
        ends = {e.task.index for e in events if e.kind == "finished" and e.task is not None}
        finished: list[FinishedCase] = []
        still_running: list[_Event] = []
        ended = 0
        for event in events:
            if event.kind == "finished" and event.task is not None and event.outcome is not None:
                final = self._finished(event.slot, event.task, event.outcome)
                if final is not None:
                    finished.append(final)
            elif event.kind == "started" and event.task is not None and event.task.index not in ends:
                still_running.append(event)
            else:
                ended += self._tell(event)
        if finished:
            self.events.cases_finished(finished)
        for event in still_running:
            self._tell(event)
        return ended

    def _tell(self, event: _Event) -> int:
        """One event that is not a case's end; 1 for a slot that ended."""
        if event.kind == "slot_done":
            return 1
        if event.kind == "slot_failed":
            self.events.slot_failed(event.slot, event.message)
        elif event.kind == "ready" and event.info is not None:
            self.events.worker_ready(event.slot, event.info)
        elif event.kind == "started" and event.task is not None:
            self.events.case_started(event.slot, event.task)
        return 0

    def _finished(self, slot: str, task: Task, outcome: CaseOutcome) -> Optional[FinishedCase]:
        """The case's bookkeeping; its final outcome, or None when it is tried again or stays missing."""
        kind = outcome.failure or (outcome.row or {}).get("error_kind")
        retry = False
        if outcome.failure == "interrupted":
            pass                                       # stays missing: `--resume` runs it
        elif outcome.worker_replaced and kind is not None:
            task.kills += 1
            task.failures.append(f"{kind}: {outcome.detail.splitlines()[0] if outcome.detail else ''}".strip())
            retry = (kind in self.retried_kinds and task.kills < KILLS_ALLOWED and not self.stop.is_set())
        with self._lock:
            self._in_flight -= 1
            if retry:
                self._pending.appendleft(task)         # a fresh worker takes it next
            elif not self._pending and self._in_flight == 0:
                self._done = True
            self._lock.notify_all()
        if retry or outcome.failure == "interrupted":
            return None
        return FinishedCase(slot, task, outcome)

    @property
    def unrun(self) -> list[Task]:
        with self._lock:
            return list(self._pending)


def _close_all(slots: Sequence[SlotLike]) -> None:
    """Close every slot at once: each waits for its worker to exit (a CUDA worker's exit tears its
    context down), and one after the other that wait grew with the number of GPUs."""
    if len(slots) <= 1:
        for slot in slots:
            slot.close()
        return
    failed: list[BaseException] = []

    def close(slot: SlotLike) -> None:
        try:
            slot.close()
        except BaseException as err:  # noqa: BLE001 - raised below, in the caller's thread, as before
            failed.append(err)

    closers = [threading.Thread(target=close, args=(slot,), name=f"close-{slot.name}") for slot in slots]
    for closer in closers:
        closer.start()
    for closer in closers:
        closer.join()
    if failed:
        raise failed[0]


def make_stop_handler(scheduler: Scheduler, on_signal: Callable[[int], None]) -> Callable[[int, Any], None]:
    """A SIGINT/SIGTERM handler: the first signal stops handing out cases; a second one ends the
    grace period at once."""
    def handler(signum: int, frame: Any) -> None:
        if scheduler.stop.is_set():
            scheduler.grace_s = 0.0
        scheduler.stop.set()
        on_signal(signum)
    return handler
