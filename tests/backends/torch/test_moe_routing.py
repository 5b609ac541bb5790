"""Forced routing distributions: histograms and determinism (CPU)."""

from __future__ import annotations

import torch

from operatorx.backends.torch.moe.routing import forced_ids, load_histogram
from operatorx.spec.moe import Routing


def _ids(dist, tokens=64, routable=16, k=4, seed=0) -> torch.Tensor:
    out = forced_ids(Routing.model_validate({"distribution": dist, "seed": seed}), tokens, routable, k)
    assert out is not None and out.shape == (tokens, k)
    assert all(len(set(row)) == k for row in out.tolist()), "k distinct experts per token"
    return out


def test_natural_is_not_forced() -> None:
    assert forced_ids(Routing(), 8, 16, 2) is None


def test_balanced_loads_are_equal() -> None:
    assert set(load_histogram(_ids("balanced"), 16)) == {64 * 4 // 16}
    loads = load_histogram(_ids("balanced", tokens=7, routable=5, k=3), 5)
    assert max(loads) - min(loads) <= 1 and sum(loads) == 21


def test_single_hot_every_token_same_experts() -> None:
    ids = _ids("single_hot")
    assert all(sorted(r) == sorted(ids[0].tolist()) for r in ids.tolist())
    loads = load_histogram(ids, 16)
    assert sorted(loads, reverse=True)[:4] == [64] * 4 and sum(loads) == 256


def test_zipf_is_skewed_and_seeded() -> None:
    ids = _ids({"kind": "zipf", "s": 1.2}, tokens=2048, routable=64, k=4)
    loads = sorted(load_histogram(ids, 64), reverse=True)
    assert loads[0] > 4 * loads[32]               # the head carries far more than the median
    assert sum(loads) == 2048 * 4
    same = _ids({"kind": "zipf", "s": 1.2}, tokens=2048, routable=64, k=4)
    other = _ids({"kind": "zipf", "s": 1.2}, tokens=2048, routable=64, k=4, seed=1)
    assert torch.equal(ids, same) and not torch.equal(ids, other)


def test_hot_experts_are_shuffled_by_seed() -> None:
    a, b = _ids("single_hot", seed=0), _ids("single_hot", seed=3)
    assert sorted(a[0].tolist()) != sorted(b[0].tolist())
