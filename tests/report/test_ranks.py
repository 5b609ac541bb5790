"""One reader of a multi-rank row's part for every display (report/ranks.py): from a typed row or a
document's metrics, the same numbers; nothing for a row without it or with a part this version
cannot read; capped ranks named with their own reasons."""

from __future__ import annotations

import pytest

from operatorx.report.ranks import capped_note, ranks_csv, ranks_of
from tests.report.rows import make_row, ranked_row


def test_the_part_reads_the_same_from_a_row_and_from_its_document():
    row = ranked_row()
    from_doc = ranks_of(row.to_json()["metrics"])
    assert from_doc == ranks_of(row) and from_doc is not None
    assert (from_doc.world, from_doc.split, from_doc.latency_us_min) == (2, "tp2", 41.2)
    assert from_doc.skew_us == pytest.approx(1.8)
    assert [p.latency_us for p in from_doc.per_rank] == [41.2, 43.0]


def test_a_single_rank_row_or_an_unreadable_part_has_none():
    assert ranks_of(make_row()) is None and ranks_of(make_row().to_json()["metrics"]) is None
    assert ranks_of({"ranks": {"world": "two"}}) is None and ranks_of({"ranks": [1, 2]}) is None
    assert ranks_csv(None) == {}


def test_the_csv_cells():
    cells = ranks_csv(ranks_of(ranked_row()))
    assert cells == {"world": 2, "split": "tp2", "latency_us_min": 41.2, "skew_us": pytest.approx(1.8),
                     "capped_ranks": [1]}


def test_capped_ranks_are_named_with_their_own_reasons():
    ranks = ranks_of(ranked_row())
    assert ranks is not None
    assert capped_note(ranks) == "clock capped on rank 1 of 2: sw_power_cap"
    both = ranks.model_copy(update={"capped_ranks": [0, 1]})
    assert capped_note(both) == "clock capped on ranks 0 (?), 1 (sw_power_cap) of 2"     # rank 0 named no reason
