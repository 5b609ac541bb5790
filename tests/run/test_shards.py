"""Shards: a stable partition by case key; disjoint, complete, and unmoved when the list grows."""

from __future__ import annotations

import pytest

from operatorx.run.config import Shard, parse_shard
from operatorx.run.plan import select_cases, shard_of
from operatorx.spec import load_testlist, resolve_testlist


def test_three_shards_are_disjoint_and_their_union_is_the_list():
    cases = load_testlist(resolve_testlist("gemm"))
    parts = [select_cases(cases, None, None, Shard(i, 3)) for i in range(3)]
    keys = [{c.key() for _, c in p} for p in parts]
    assert not (keys[0] & keys[1]) and not (keys[0] & keys[2]) and not (keys[1] & keys[2])
    assert keys[0] | keys[1] | keys[2] == {c.key() for c in cases}
    assert all(len(p) > len(cases) / 3 * 0.9 for p in parts)         # a hash spreads them evenly


def test_a_growing_list_keeps_cases_on_their_shard():
    cases = load_testlist(resolve_testlist("gemm"))
    before = {c.key(): shard_of(c, 4) for c in cases[:100]}
    shuffled = list(reversed(cases))                                 # positions change, keys do not
    assert {c.key(): shard_of(c, 4) for c in shuffled if c.key() in before} == before


@pytest.mark.parametrize("text", ["3/3", "1", "a/b", "-1/2", "0/0"])
def test_bad_shards_are_refused(text):
    with pytest.raises(ValueError, match="--shard"):
        parse_shard(text)
