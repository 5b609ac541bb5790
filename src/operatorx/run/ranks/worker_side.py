"""A worker's answer to a case that came with a rank (a `case` message with `rank`, run/protocol.py).

Every rank answers with one `row` message: rank 0's holds the case's row, the others' `row` is
null; each carries `rank_result` (its status, message, error kind, whether its group broke) and
`replace`. The memory check after the case is every rank's own: a rank that leaked, or whose group
broke, asks to be replaced, and the parent then replaces all of the case's workers.
"""

from __future__ import annotations

from typing import IO, Any

from operatorx.run.memory_watch import MemoryWatch
from operatorx.run.protocol import send
from operatorx.run.ranks.assignment import RankAssignment
from operatorx.spec import Case

__all__ = ["serve_rank_case"]


def serve_rank_case(job: Any, case: Case, index: int, body: dict[str, Any], channel: IO[str],
                    watch: MemoryWatch, device_limit_mib: float, host_limit_mib: float) -> bool:
    """Run this worker's rank of the case and send its answer; whether the worker must be replaced."""
    from operatorx.run.worker import finish_row  # (run/worker.py imports this module)

    assignment = RankAssignment.model_validate(body["rank"])
    runs_ranks = getattr(job, "run_rank", None)
    if runs_ranks is None:                    # an A/B job: the parent does not send one a rank (not built)
        send(channel, "row", index=index, row=None, replace=True,
             rank_result={"rank": assignment.rank, "status": "error", "error_kind": "exception", "broken": True,
                          "message": "this worker's job runs no multi-rank case"})
        return True
    result = runs_ranks(case, index, assignment)
    delta = watch.after_case(case.type)
    if result.row is not None:
        row, replace = finish_row(result.row, delta, device_limit_mib, host_limit_mib)
        replace = replace or result.broken
        send(channel, "row", index=index, row=row.to_json(), replace=replace, rank_result=result.brief())
        return replace
    brief = result.brief()
    leak = delta.leak(device_limit_mib, host_limit_mib)
    if leak is not None:
        brief["message"] = f"{brief['message']}; {leak}" if brief.get("message") else leak
        if brief["status"] == "ok":
            brief.update(status="error", error_kind="leak")
    replace = leak is not None or result.broken or brief.get("error_kind") in ("cuda_fault", "oom")
    send(channel, "row", index=index, row=None, replace=replace, rank_result=brief)
    return replace
