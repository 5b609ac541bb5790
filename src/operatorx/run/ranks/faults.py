"""Faults injected into one rank of a multi-rank case, for the tests of the timing and fault paths.

`OPERATORX_RANK_FAULT=RANK:KIND[:SECONDS]` in the sweep's environment (workers inherit it):
- `sleep_before_barrier:S`: the rank sleeps S seconds before each timed iteration's barrier (a late
  launch: the barrier must absorb it, so the number does not move);
- `sleep_in_call:S`: the rank's timed call sleeps S seconds after the op (a slow rank: the skew
  and the slowest rank's time show it);
- `kill_in_timing`: the rank kills itself (SIGKILL) when its timed iterations begin;
- `hang_in_timing`: the rank stops answering (sleeps) when its timed iterations begin.
Unset (every real run): nothing is injected. A value that does not parse is refused in one line.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["RankFault", "FAULT_ENV", "rank_fault"]

FAULT_ENV = "OPERATORX_RANK_FAULT"
_KINDS = ("sleep_before_barrier", "sleep_in_call", "kill_in_timing", "hang_in_timing")


@dataclass(frozen=True)
class RankFault:
    rank: int
    kind: str
    seconds: float = 0.0

    def before_barrier(self) -> Optional[Callable[[], None]]:
        if self.kind != "sleep_before_barrier":
            return None
        return lambda: time.sleep(self.seconds)

    def wrap(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """The timed call as this rank makes it: slowed after the op for `sleep_in_call`."""
        if self.kind != "sleep_in_call":
            return fn

        def slowed() -> Any:
            out = fn()
            time.sleep(self.seconds)
            return out
        return slowed

    def timing_begins(self) -> None:
        if self.kind == "kill_in_timing":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "hang_in_timing":
            while True:
                time.sleep(3600)


def rank_fault(rank: int, text: Optional[str] = None) -> Optional[RankFault]:
    """The fault for `rank` from `text` (default: the environment), or None. ValueError naming the
    variable when the value does not parse."""
    raw = os.environ.get(FAULT_ENV, "") if text is None else text
    if not raw.strip():
        return None
    parts = raw.strip().split(":")
    try:
        who, kind = int(parts[0]), parts[1]
        seconds = float(parts[2]) if len(parts) > 2 else 0.0
    except (IndexError, ValueError) as err:
        raise ValueError(f"{FAULT_ENV}={raw!r}: use RANK:KIND[:SECONDS], KIND one of {', '.join(_KINDS)}") from err
    if kind not in _KINDS or len(parts) > 3 or seconds < 0:
        raise ValueError(f"{FAULT_ENV}={raw!r}: use RANK:KIND[:SECONDS], KIND one of {', '.join(_KINDS)}")
    return RankFault(who, kind, seconds) if who == rank else None
