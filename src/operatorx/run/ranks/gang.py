"""The parent's side of a multi-rank case: its W workers driven as one, their W answers made one outcome.

A gang is the W slots (workers of one host) a W-rank case runs on. The first case of a split on
a gang forms a new group: a fresh rendezvous port on 127.0.0.1 and a new group key, sent to every
rank with the case (run/ranks/assignment.py). Later cases of the same split on the same workers
reuse that group. A worker that was ever in a group runs no other group's case: when its group is
dissolved (its split has no more cases, or a case replaced a worker) it is replaced by a fresh one.

What the W answers mean (`combine`), most telling first:
1. a rank whose worker died on its own (crashed, killed for memory): the case's failure is that
   rank's; the others' errors (a peer closed its connection) follow from it;
2. a rank whose error is its own (the ranks agree after every step, so every rank then reports it,
   and rank 0's row names the rank);
3. ranks that gave no answer (hung) while the others failed in a collective or passed the deadline:
   `timeout`, naming the silent ranks;
4. otherwise rank 0's row; a rank that leaked or whose group broke makes it an error and replaces
   every worker of the case.
Any failure replaces all W workers: a group with one new member cannot be trusted, nor re-formed
around the survivors. So does a rank's worker that ended between two cases of its group: the next
case dissolves the group and seats its ranks afresh.

Where the ranks run (`GangHomes`): local workers run their gang's ranks themselves, and the parent
picks the rendezvous port. Under Ray (run/ranks/ray_gang.py) the gang's members hand their
resources to W fresh actors in one placement group on their node, for as long as the gang lives,
and rank 0's actor picks the port on that node: the parent may be on another machine.
"""

from __future__ import annotations

import itertools
import queue
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Protocol

from operatorx.result_ranks import PlacementGroup
from operatorx.run.ranks.assignment import GroupBackend, RankAssignment
from operatorx.run.worker_process import CaseOutcome

if TYPE_CHECKING:
    from operatorx.run.scheduler import Task
    from operatorx.spec import Case

__all__ = ["GangSlot", "GangHomes", "GangRunner", "RankAnswer", "combine", "free_port", "TROUBLE_GRACE_S",
           "collective_timeout_s"]

TROUBLE_GRACE_S = 5.0
"""After one rank failed, how long the others get to answer before they are taken for hung and killed."""

_COLLECTIVE_FAILURE = re.compile(r"gloo|nccl|connection (closed|reset)|timed out|timeout|broken pipe|"
                                 r"processgroup|peer|socket", re.IGNORECASE)


class GangSlot(Protocol):
    """What a gang needs of a slot (run/worker_process.Slot)."""

    name: str
    env: dict[str, str]
    worker: Any

    def ensure_worker(self) -> dict[str, Any]: ...
    def send_case(self, index: int, case: Case, ahead: bool = False,
                  rank: Optional[dict[str, Any]] = None) -> bool: ...
    def await_case(self, index: int, deadline_s: float, stop: threading.Event) -> CaseOutcome: ...
    def kill(self) -> None: ...


class GangHomes(Protocol):
    """Where a gang's ranks run, when not on its members' own workers (Ray: run/ranks/ray_gang.py)."""

    def seat(self, members: Sequence[Any]) -> Sequence[GangSlot]:
        """The W slots the ranks run on (rank r on the r-th), made for these members; raises with why not."""
        ...

    def port(self, ranks: Sequence[GangSlot]) -> int:
        """A free rendezvous port on the ranks' host, picked there."""
        ...

    def placement_group(self, ranks: Sequence[GangSlot]) -> Optional[PlacementGroup]:
        """Where the ranks were put together, for the row (after their workers started)."""
        ...

    def unseat(self, members: Sequence[Any]) -> None:
        """The ranks' processes gone, and the members free to run single-rank cases again."""
        ...


def free_port() -> int:
    """A TCP port on 127.0.0.1 no one listens on now (the group's rendezvous; rank 0 binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def collective_timeout_s(deadline_s: float, backend: GroupBackend) -> float:
    """The group's collective timeout. gloo: 80% of the case's deadline, so a rank waiting on a dead or
    hung peer raises and says so before the parent's deadline. NCCL: past the deadline, because
    NCCL's watchdog kills the waiting process, which would read as that rank's crash; the parent's
    deadline ends the case first."""
    return max(5.0, 0.8 * deadline_s) if backend == "gloo" else deadline_s + 60.0


@dataclass(frozen=True)
class RankAnswer:
    """What became of one rank: its outcome, and whether it ended only because the parent killed it."""

    rank: int
    name: str
    outcome: CaseOutcome
    killed: bool = False


def _first_line(text: str) -> tuple[str, str]:
    first, _, rest = text.partition("\n")
    return first, rest


def _rank_error(answer: RankAnswer) -> Optional[tuple[str, str, bool]]:
    """(kind, message, is_a_collective_failure) of a rank that answered with an error, else None."""
    result = answer.outcome.rank_result or {}
    if answer.outcome.failure is not None or result.get("status") != "error":
        return None
    message = str(result.get("message") or "")
    kind = str(result.get("error_kind") or "exception")
    return kind, message, bool(_COLLECTIVE_FAILURE.search(message)) and kind == "exception"


def combine(answers: Sequence[RankAnswer], world: int, index: int, stopping: bool) -> CaseOutcome:
    """One outcome for the case from its ranks' answers (in rank order), by the rules above."""
    by_rank = sorted(answers, key=lambda a: a.rank)
    replaced = any(a.outcome.worker_replaced or a.outcome.failure is not None
                   or (a.outcome.rank_result or {}).get("broken") for a in by_rank)
    seconds = max((a.outcome.seconds for a in by_rank), default=0.0)
    if stopping and any(a.outcome.failure == "interrupted" for a in by_rank):
        return CaseOutcome(index=index, failure="interrupted", worker_replaced=True, seconds=seconds)
    died = [a for a in by_rank if a.outcome.failure in ("crashed", "oom") and not a.killed]
    if died:
        a = died[0]
        what, tail = _first_line(a.outcome.detail)
        first = (f"of rank {a.rank} of {world} ({a.name}) {what}" if a.outcome.failure == "crashed"
                 else f"rank {a.rank} of {world} ({a.name}): {what}")
        return CaseOutcome(index=index, failure=a.outcome.failure, detail=f"{first}\n{tail}".rstrip(),
                           worker_replaced=True, seconds=seconds)
    errors = [(a, e) for a in by_rank if (e := _rank_error(a)) is not None]
    own = [(a, e) for a, e in errors if not e[2]]
    silent = [a for a in by_rank if a.outcome.failure == "timeout" or (a.killed and a.outcome.row is None
                                                                       and a.outcome.rank_result is None)]
    if not own and silent:
        names = ", ".join(f"rank {a.rank} ({a.name})" for a in silent)
        why = next((_first_line(a.outcome.detail)[0] for a in silent if a.outcome.failure == "timeout"), "")
        waited = "; ".join(e[1] for _, e in errors)
        first = f"{names} of {world} gave no answer{f' ({why})' if why else ''}"
        if waited:
            first += f"; the others failed waiting for it: {waited}"
        tail = _first_line(silent[0].outcome.detail)[1]
        return CaseOutcome(index=index, failure="timeout", detail=f"{first}\n{tail}".rstrip(), worker_replaced=True,
                           seconds=seconds)
    zero = by_rank[0] if by_rank and by_rank[0].rank == 0 else None
    if zero is None or zero.outcome.row is None:
        # rank 0 gave no row (and no rank died or hung): the first rank's error stands for the case
        a, (kind, message, _) = (own or errors)[0] if (own or errors) else (by_rank[0], ("crashed", "no row", False))
        return CaseOutcome(index=index, failure=kind if kind in ("timeout", "crashed", "oom") else "crashed",
                           detail=f"of rank {a.rank} of {world} ({a.name}): no row; {message}", worker_replaced=True,
                           seconds=seconds)
    row = zero.outcome.row
    late = [(a, e) for a, e in own if a.rank != 0 and row.get("status") == "ok"]
    if late:                                   # a rank's own failure after rank 0's row (its memory check)
        a, (kind, message, _) = late[0]
        row = {**row, "status": "error", "error_kind": kind, "message": f"rank {a.rank} of {world}: {message}"}
    return CaseOutcome(index=index, row=row, worker_replaced=replaced, seconds=seconds,
                       rank_result=zero.outcome.rank_result)


@dataclass
class _Formed:
    key: str
    port: int
    workers: tuple[str, ...]
    """Each member's worker process (its session token) when the group formed: a new process means a new group."""
    placement_group: Optional[PlacementGroup] = None


def _worker_key(slot: GangSlot) -> str:
    """The slot's current worker process, as a key no later process shares (its session token)."""
    return str(getattr(slot.worker, "session_token", None) or id(slot.worker))


class GangRunner:
    """Runs multi-rank cases on gangs of slots; keeps each gang's group while its workers live."""

    def __init__(self, device_kind: str, deadline_s: float, homes: Optional[GangHomes] = None):
        self.device_kind = device_kind
        self.homes = homes
        """None: each member runs its rank on its own worker, and the parent picks the port."""
        self._seated: dict[tuple[str, ...], Sequence[GangSlot]] = {}
        self.backend: GroupBackend = "nccl" if device_kind == "cuda" else "gloo"
        self.timeout_s = collective_timeout_s(deadline_s, self.backend)
        self._formed: dict[tuple[str, ...], _Formed] = {}
        self._grouped: set[str] = set()
        """Every worker process (by session token) that joined a group: it never joins another."""
        self._serial = itertools.count(1)

    def _intact(self, members: Sequence[GangSlot]) -> Optional[_Formed]:
        formed = self._formed.get(tuple(s.name for s in members))
        if formed is None:
            return None
        live = tuple(_worker_key(s) if s.worker is not None and s.worker.alive() else "" for s in members)
        return formed if live == formed.workers else None

    def _workers(self, members: Sequence[GangSlot], on_ready: Callable[[str, dict[str, Any]], None]) -> Optional[str]:
        """Every member's worker ready (fresh ones started side by side); why not, for the first that failed."""
        for s in members:                      # a worker that was in another group is replaced
            if s.worker is not None and _worker_key(s) in self._grouped:
                s.kill()
        failed: list[str] = []

        def start(r: int, s: GangSlot) -> None:
            fresh = s.worker is None or not s.worker.alive()
            try:
                info = s.ensure_worker()
            except Exception as err:  # noqa: BLE001 - the case's failure, said below
                said = str(err).splitlines()[0] if str(err) else type(err).__name__
                failed.append(f"of rank {r} ({s.name}) could not start: {said}")
                return
            if fresh:
                on_ready(s.name, info)

        threads = [threading.Thread(target=start, args=(r, s), name=f"gang-start-{s.name}")
                   for r, s in enumerate(members)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return failed[0] if failed else None

    def run(self, members: Sequence[GangSlot], task: Task, deadline_s: float, stop: threading.Event,
            on_ready: Callable[[str, dict[str, Any]], None]) -> CaseOutcome:
        """The case on `members` (rank r on members[r]): one outcome, all W workers replaced on a failure."""
        world = len(members)
        gang = members
        try:
            members = self._ranks(gang)
            formed = self._intact(members)
            if formed is None and tuple(s.name for s in members) in self._formed:
                # a rank's worker ended since the group's last case (under Ray its actor, which is never
                # restarted): the group is ended and its ranks seated afresh (new actors, a new placement
                # group), rather than starting workers in homes that are gone
                self.dissolve(gang)
                members = self._ranks(gang)
            why = None if formed is not None else self._workers(members, on_ready)
            if formed is None and why is None:
                homes = self.homes
                formed = _Formed(key=f"{task.split or 'group'}#{next(self._serial)}",
                                 port=homes.port(members) if homes is not None else free_port(),
                                 workers=tuple(_worker_key(s) for s in members),
                                 placement_group=homes.placement_group(members) if homes is not None else None)
                self._formed[tuple(s.name for s in members)] = formed
                self._grouped.update(formed.workers)
        except Exception as err:  # noqa: BLE001 - ranks that could not be placed or reached: the case's failure
            said = str(err).splitlines()[0] if str(err) else type(err).__name__
            formed, why = None, f"of the {world}-rank gang {'+'.join(s.name for s in gang)} could not start: {said}"
        if formed is None:
            self.dissolve(gang)
            return CaseOutcome(index=task.index, failure="crashed", detail=why or "", worker_replaced=True)
        group: _Formed = formed
        gpus = [s.env.get("CUDA_VISIBLE_DEVICES") if self.device_kind == "cuda" else None for s in members]
        answers: queue.Queue[RankAnswer] = queue.Queue()
        killed = threading.Event()

        def wait(r: int, s: GangSlot) -> None:
            assignment = RankAssignment(rank=r, world=world, split=task.split, group=group.key, port=group.port,
                                        backend=self.backend, timeout_s=self.timeout_s,
                                        workers=[m.name for m in members], gpus=gpus,
                                        placement_group=group.placement_group)
            try:
                sent = s.send_case(task.index, task.case, rank=assignment.model_dump(mode="json"))
                gone = CaseOutcome(index=task.index, failure="crashed", worker_replaced=True,
                                   detail="was gone before the case started")
                outcome = s.await_case(task.index, deadline_s, stop) if sent else gone
            except Exception as err:  # noqa: BLE001 - the slot's own failure is this rank's, never a hang
                s.kill()
                outcome = CaseOutcome(index=task.index, failure="crashed", worker_replaced=True,
                                      detail=f"failed in the sweep itself: {type(err).__name__}: {err}")
            answers.put(RankAnswer(r, s.name, outcome, killed=killed.is_set()))

        threads = [threading.Thread(target=wait, args=(r, s), daemon=True, name=f"rank{r}-{s.name}")
                   for r, s in enumerate(members)]
        for t in threads:
            t.start()
        got: dict[int, RankAnswer] = {}
        trouble_until: Optional[float] = None
        while len(got) < world:
            wait_s = 0.25 if trouble_until is None else max(0.0, min(0.25, trouble_until - time.monotonic()))
            try:
                a = answers.get(timeout=wait_s)
            except queue.Empty:
                if trouble_until is not None and time.monotonic() >= trouble_until and not killed.is_set():
                    killed.set()               # the ranks still silent are hung, or stuck waiting for a dead peer
                    for r, s in enumerate(members):
                        if r not in got:
                            s.kill()
                continue
            got[a.rank] = a
            troubled = a.outcome.failure is not None or (a.outcome.rank_result or {}).get("status") not in (None, "ok")
            if troubled and trouble_until is None:
                trouble_until = time.monotonic() + TROUBLE_GRACE_S
        for t in threads:
            t.join(timeout=1.0)
        outcome = combine(list(got.values()), world, task.index, stop.is_set())
        if outcome.worker_replaced:
            self.dissolve(gang)
        return outcome

    def _ranks(self, members: Sequence[GangSlot]) -> Sequence[GangSlot]:
        """The slots the gang's ranks run on: the members themselves, or those its homes seated for it."""
        if self.homes is None:
            return members
        key = tuple(s.name for s in members)
        if key not in self._seated:
            self._seated[key] = self.homes.seat(members)
        return self._seated[key]

    def dissolve(self, members: Sequence[GangSlot]) -> None:
        """End the gang's group: its workers are killed (each slot starts a fresh one when next needed)."""
        key = tuple(s.name for s in members)
        for s in self._seated.pop(key, members):
            if s.worker is not None:
                s.kill()
        self._formed.pop(key, None)
        if self.homes is not None:
            self.homes.unseat(members)
