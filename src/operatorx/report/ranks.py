"""What the tables, exports and pages show of a multi-rank row (`metrics.ranks`, result_ranks.py).

Every reader of the part for display goes through `ranks_of`, from a typed `Row` or from a
document's `metrics`, so the terminal table, Markdown, CSV and the pages show the same numbers.
A row without the part (a single-rank case, or a multi-rank case that did not run) has none of
these cells: they are left blank, not `-`, since such a row has no skew to be unknown.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, Union

from pydantic import ValidationError

from operatorx.result import Row
from operatorx.result_parts import DOCUMENT
from operatorx.result_ranks import Ranks

__all__ = ["RANKS_CSV_FIELDS", "ranks_of", "ranks_csv", "capped_note"]

RANKS_CSV_FIELDS = ("world", "split", "latency_us_min", "skew_us", "capped_ranks")
"""The CSV's columns of a multi-rank row, named as the part's keys (docs/metrics.md, `ranks`)."""


def ranks_of(row: Union[Row, Mapping[str, Any]]) -> Optional[Ranks]:
    """The row's multi-rank part: `Row.ranks`, or a document's `metrics["ranks"]` read through the
    typed model (as a stored document). None where the row has none, or where this version cannot
    read it: the row's other cells still show what it holds."""
    if isinstance(row, Row):
        return row.ranks
    part = row.get("ranks")
    if not isinstance(part, Mapping):
        return None
    try:
        return Ranks.model_validate(part, context=DOCUMENT)
    except ValidationError:
        return None


def ranks_csv(ranks: Optional[Ranks]) -> dict[str, Any]:
    """The `RANKS_CSV_FIELDS` cells: `capped_ranks` as a JSON list (`[]`: none capped); all empty
    for a row without the part."""
    if ranks is None:
        return {}
    return {"world": ranks.world, "split": ranks.split, "latency_us_min": ranks.latency_us_min,
            "skew_us": ranks.skew_us, "capped_ranks": list(ranks.capped_ranks)}


def capped_note(ranks: Ranks) -> str:
    """`clock capped on rank 1 of 2: sw_power_cap`: which ranks' GPUs were capped and why, from each
    rank's own telemetry (the row's telemetry is rank 0's, which may not be the capped one)."""
    lines = {line.rank: line for line in ranks.per_rank}

    def why(rank: int) -> str:
        telemetry = lines[rank].telemetry if rank in lines else None
        return ",".join((telemetry.capping_reasons if telemetry else None) or ["?"])

    if len(ranks.capped_ranks) == 1:
        rank = ranks.capped_ranks[0]
        return f"clock capped on rank {rank} of {ranks.world}: {why(rank)}"
    each = ", ".join(f"{rank} ({why(rank)})" for rank in ranks.capped_ranks)
    return f"clock capped on ranks {each} of {ranks.world}"
