"""Forced routing distributions: expert ids chosen ahead of time, replacing the router's choice.

All are drawn on the CPU from the case's seed, so a case routes identically on every device.
Ids range over the routable experts (routed plus zero experts); every token gets k distinct ids.
- balanced: assignments dealt round-robin, so every expert's load differs by at most one;
- single_hot: every token picks the same k experts;
- zipf(s): expert popularity ∝ 1/rank^s; each token draws k distinct experts by popularity.
Expert labels are shuffled by the seed, so the hot experts are not always 0, 1, 2...
"""

from __future__ import annotations

from typing import Optional

import torch

from operatorx.spec.moe import Routing, Zipf

__all__ = ["forced_ids", "load_histogram"]


def forced_ids(routing: Routing, tokens: int, routable: int, top_k: int) -> Optional[torch.Tensor]:
    """[tokens, top_k] int64 on the CPU, or None for `natural` (the router's own choice)."""
    dist = routing.distribution
    if dist == "natural":
        return None
    gen = torch.Generator().manual_seed(routing.seed)
    perm = torch.randperm(routable, generator=gen)
    if dist == "balanced":
        offset = int(torch.randint(routable, (1,), generator=gen))
        labels = (torch.arange(tokens * top_k) + offset) % routable
        return perm[labels].view(tokens, top_k)
    if dist == "single_hot":
        return perm[:top_k].expand(tokens, top_k).contiguous()
    assert isinstance(dist, Zipf)
    popularity = torch.arange(1, routable + 1, dtype=torch.float64).pow(-dist.s)
    labels = torch.multinomial(popularity.expand(tokens, routable), top_k, replacement=False, generator=gen)
    return perm[labels]


def load_histogram(ids: torch.Tensor, routable: int) -> list[int]:
    """Assignments per expert (index = expert id), from the ids actually used."""
    return torch.bincount(ids.reshape(-1).cpu(), minlength=routable).tolist()
