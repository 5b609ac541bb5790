"""Which cases a run holds: the testlist's cases, narrowed by `--filter`, `--limit` and `--shard`.

A shard is chosen by hashing the case key, never by position: a testlist that grows keeps every
existing case on its shard, and every machine computes the same partition.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Optional, TypeVar

from operatorx.bulk import gc_paused
from operatorx.run.config import Shard
from operatorx.spec import Case

__all__ = ["select_cases", "shard_of", "in_shard", "longest_first", "estimated_s"]

_ORDER_TFLOPS, _ORDER_GBPS = 1000.0, 4000.0   # round rates of a current GPU: only the order uses them
T = TypeVar("T")


def select_cases(cases: list[Case], text: Optional[str], limit: Optional[int],
                 shard: Optional[Shard] = None, indexes: Optional[Sequence[int]] = None) -> list[tuple[int, Case]]:
    """(index in the testlist, case) for cases whose label, scheme or sources contain `text`, in
    `shard` when given; `limit` applies last (the first N of this shard). `indexes` are the cases'
    indexes in the file (a `Testlist`'s, duplicates merged); default their positions in `cases`."""
    numbered = zip(indexes, cases, strict=True) if indexes is not None else enumerate(cases)
    with gc_paused():              # 10^5 new tuples over 10^5 live cases (operatorx/bulk.py)
        if text is None and shard is None:
            chosen = list(numbered)
        else:
            chosen = [(i, c) for i, c in numbered
                      if (text is None or any(text in s for s in (c.label(), c.scheme(), *c.sources)))
                      and (shard is None or in_shard(c, shard))]
    return chosen[:limit] if limit is not None else chosen


def shard_of(case: Case, count: int) -> int:
    """The shard (0..count-1) of a case: the first 8 bytes of SHA-256 of its key, modulo count."""
    digest = hashlib.sha256(case.key().encode()).digest()
    return int.from_bytes(digest[:8], "big") % count


def in_shard(case: Case, shard: Shard) -> bool:
    return shard_of(case, shard.count) == shard.index


def estimated_s(case: Case) -> float:
    """A case's device seconds per call at round rates (the larger of compute and memory time):
    used only to order work, never reported."""
    return max(case.flops() / (_ORDER_TFLOPS * 1e12), case.min_bytes() / (_ORDER_GBPS * 1e9))



def longest_first(tasks: list[T], case_of: Callable[[T], Case]) -> list[T]:
    """The tasks whose cases have the longest estimated calls first, the testlist order among equals.

    With several workers pulling from one queue, a run ends when its last case does: a long prefill
    GEMM near the end of the list keeps one GPU busy while the others sit idle. Handing out the long
    cases first leaves the short ones to even out
    the end. With one worker the sweep keeps the testlist order (nothing to balance).
    """
    return sorted(tasks, key=lambda t: -estimated_s(case_of(t)))
