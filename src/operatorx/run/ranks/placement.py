"""Which of a sweep's cases run on several workers at once, which cannot here, and in what order.

A case with `parallel` tp·dp = W > 1 (of an implemented op type, without `--rank-local`) needs W
workers of one host at once: W GPUs, or on the CPU device W of `--workers`; under `--executor ray`,
W of the run's slots on one node (a slot per GPU, or per CPU, of the node: Ray's resources), since
the W ranks' actors share one placement group there (run/ranks/ray_gang.py). A run with fewer is
refused with the count (`unsupported`, never timed as something else); so is one whose executor
cannot give a case several worker processes (`inline`: one process), and an A/B run (not built).
Multi-rank cases go first, each split's cases together (in their order), so a split's group is
formed once and its workers stay busy with it; single-rank cases follow and fill every worker a
gang does not hold. `--shard` never splits a case: a multi-rank case is one case of one shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from operatorx.result import Row
    from operatorx.run.scheduler import Task

__all__ = ["place", "refusal", "refused_row"]


def refusal(world: int, *, executor: str, device_kind: str, workers: int, ab: bool) -> Optional[str]:
    """Why a case of `world` ranks cannot run in this sweep (None: it can); `workers`: the most slots
    of one host (of one Ray node under `ray`)."""
    needs = f"needs tp·dp = {world} GPUs of one host"
    if ab:
        return f"{needs}: an A/B of a multi-rank case is not built yet"
    if executor == "inline":
        return f"{needs}; this run has 1 (--executor inline runs every case in one process)"
    if executor == "ray" and world > workers:
        what = "GPUs" if device_kind == "cuda" else "CPU workers"
        return (f"needs tp·dp = {world} {what} of one Ray node; this run has {workers} on its largest node "
                f"(one slot per {'GPU' if device_kind == 'cuda' else 'CPU'} of a node, by Ray's resources)")
    if world > workers:
        if device_kind == "cuda":
            return f"{needs}; this run has {workers}"
        return f"needs tp·dp = {world} workers of one host; this run has {workers} (--workers {workers})"
    return None


def place(tasks: Sequence[Task], *, rank_local: bool, executor: str, device_kind: str, workers: int,
          ab: bool) -> tuple[list[Task], list[tuple[Task, str]]]:
    """(the tasks to schedule, in order, each multi-rank one marked with its world and split; the
    tasks refused here, with why)."""
    groups: dict[str, list[Task]] = {}
    singles: list[Task] = []
    refused: list[tuple[Task, str]] = []
    for task in tasks:
        case = task.case
        if case.world <= 1 or rank_local or not case.implemented or case.parallel is None:
            singles.append(task)
            continue
        why = refusal(case.world, executor=executor, device_kind=device_kind, workers=workers, ab=ab)
        if why is not None:
            refused.append((task, why))
            continue
        task.world, task.split = case.world, case.parallel.label()
        groups.setdefault(task.split, []).append(task)
    ordered = [t for split_tasks in groups.values() for t in split_tasks]
    return ordered + singles, refused


def refused_row(task: Task, why: str, backend: str, testlist: str) -> Row:
    """The `unsupported` row of a case this sweep cannot give the workers it needs."""
    from operatorx.result import Row

    data: dict[str, Any] = {"case": task.case, "backend": backend, "status": "unsupported", "testlist": testlist,
                            "case_index": task.index, "message": why, "scheme": task.case.scheme()}
    return Row.model_validate(data)
