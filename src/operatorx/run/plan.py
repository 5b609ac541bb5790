"""Which cases a run holds: the testlist's cases, narrowed by `--filter`, `--limit` and `--shard`.

A shard is chosen by hashing the case key, never by position: a testlist that grows keeps every
existing case on its shard, and every machine computes the same partition.
"""

from __future__ import annotations

import hashlib
from typing import Optional

from operatorx.run.config import Shard
from operatorx.spec import Case

__all__ = ["select_cases", "shard_of", "in_shard"]


def select_cases(cases: list[Case], text: Optional[str], limit: Optional[int],
                 shard: Optional[Shard] = None) -> list[tuple[int, Case]]:
    """(index in the testlist, case) for cases whose label, scheme or sources contain `text`, in
    `shard` when given; `limit` applies last (the first N of this shard)."""
    chosen = [(i, c) for i, c in enumerate(cases)
              if (text is None or any(text in s for s in (c.label(), c.scheme(), *c.sources)))
              and (shard is None or in_shard(c, shard))]
    return chosen[:limit] if limit is not None else chosen


def shard_of(case: Case, count: int) -> int:
    """The shard (0..count-1) of a case: the first 8 bytes of SHA-256 of its key, modulo count."""
    digest = hashlib.sha256(case.key().encode()).digest()
    return int.from_bytes(digest[:8], "big") % count


def in_shard(case: Case, shard: Shard) -> bool:
    return shard_of(case, shard.count) == shard.index
