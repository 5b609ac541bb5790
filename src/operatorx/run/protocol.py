"""Messages between the sweep's parent and a worker process: one JSON object per line.

parent → worker (the worker's stdin):   init {job}, case {index, case, attempt, rank?}, stop
worker → parent (a private pipe):       ready {info}, started {index}, row {index, row, replace, rank_result?},
                                        failed {message}

A case sent with `rank` is one rank of a multi-rank case (run/ranks/assignment.py); every rank
answers with a `row` (null but on rank 0) and its `rank_result` (run/ranks/worker_side.py).

The worker's own stdout is pointed at its stderr log before any user code runs, so nothing an op
prints can corrupt this channel.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from typing import IO, Any, Optional

__all__ = ["STACKS_SIGNAL", "WorkerMessage", "send", "parse"]


#: The signal a parent sends a worker whose case timed out, before it kills it: the worker's faulthandler
#: writes every thread's Python stack to its log, so the timeout row says where the case waited.
STACKS_SIGNAL = signal.SIGUSR1


@dataclass(frozen=True)
class WorkerMessage:
    kind: str
    """init, case, stop (to the worker); ready, started, row, failed (from it)."""
    body: dict[str, Any]

    def to_line(self) -> str:
        return json.dumps({"kind": self.kind, **self.body}, allow_nan=False, default=str) + "\n"


def send(stream: IO[str], kind: str, **body: Any) -> None:
    stream.write(WorkerMessage(kind, body).to_line())
    stream.flush()


def parse(line: str) -> Optional[WorkerMessage]:
    """A message, or None for a line that is not one (never raises)."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        return None
    kind = data.pop("kind")
    return WorkerMessage(kind, data)
