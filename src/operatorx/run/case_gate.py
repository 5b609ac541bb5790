"""What a run may time of a case: the case itself, one rank's shard of it, or nothing (and why).

A case of an op type this version has no backend for is `unsupported` by name. A split case
(tp·dp = W > 1) is the whole layer over W ranks: the sweep runs it on W workers as one group
(run/ranks/); a worker that is handed it alone (one process: `--executor inline`) refuses it
with the count it needs, never times the unsplit layer under its label; with `--rank-local` the
run times one rank's shard instead and the row says so (spec/shard.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from operatorx.catalog.gemm_split import CATALOG_SHAPES
from operatorx.spec import Case
from operatorx.spec.shard import RankLocal, ShardRefused

__all__ = ["Gate", "gate_case", "case_refusal"]

#: The devices a case handed to one worker gets (a multi-rank case gets its W workers as a group).
DEVICES_PER_CASE = 1


@dataclass(frozen=True)
class Gate:
    """`timed`: the case to hand the backend (None: refused, `reason` says why); `rank_local`: what
    the shard is, when the run times one."""

    timed: Optional[Case]
    reason: Optional[str] = None
    rank_local: Optional[RankLocal] = None


def case_refusal(case: Case, ranks: int = DEVICES_PER_CASE) -> Optional[str]:
    """Why no backend may time this case as it stands on `ranks` ranks (None: it may)."""
    if not case.implemented:
        missing = case.args.missing()
        return f"op type {case.type} is not implemented yet" + (f": {missing}" if missing else "")
    if case.world > ranks:
        return (f"needs tp·dp = {case.world} GPUs of one host; this run has {ranks} (one process runs every case "
                "here; --rank-local times one rank's shard)")
    return None


def gate_case(case: Case, rank_local: bool) -> Gate:
    """The case, its rank-0 shard (with `rank_local`), or the reason neither can be timed."""
    if not case.implemented or case.parallel is None or not rank_local:
        reason = case_refusal(case)
        return Gate(None, reason) if reason is not None else Gate(case)
    try:
        args, rule = case.args.rank_shard(case.sources, CATALOG_SHAPES)
    except ShardRefused as err:
        return Gate(None, f"--rank-local: no shard of this case: {err}")
    shard = Case(type=case.type, args=args, sources=list(case.sources))
    info = RankLocal(world=case.world, split=case.parallel.label(), rule=rule, shard=shard.args_dict())
    return Gate(shard, rank_local=info)
