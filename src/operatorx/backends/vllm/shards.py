"""This rank's shard of a whole checkpoint tensor, cut to the shape vLLM gave the parameter.

Under TP and EP vLLM's MoE layers register only the rank's part: the experts of its EP rank (dim 0,
the linear placement: rank r holds experts r·E/W … (r+1)·E/W − 1) and, under TP, its slice of each
expert's intermediate size (w13's gate and up halves each, w2's last dim; a shared MLP's merged
gate_up rows and its down projection's columns). Weights, scales and biases follow the same rule,
so the shard is found from the shapes alone: a dim that is an integer multiple of the parameter's
is cut into that many parts and this rank's part kept; a merged dim is cut half by half. A tensor
that does not fit that way is returned as it is, and the loader names the mismatch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Optional

import torch

__all__ = ["shard_for_rank", "expert_merged_dim", "shard_tensors"]


def expert_merged_dim(name: str) -> Optional[int]:
    """FusedMoE's tensors: `w13_*` stack the gate and up halves along dim 1 ([E, 2I, ...])."""
    return 1 if name.startswith("w13") else None


def shard_for_rank(t: torch.Tensor, shape: Sequence[int], rank: int, merged: Optional[int] = None) -> torch.Tensor:
    """`t` cut down to `shape`: rank `rank`'s part of every dim that is a whole multiple of it."""
    if t.dim() != len(shape):
        return t
    out = t
    for d, want in enumerate(shape):
        have = out.shape[d]
        if have == want or want == 0 or have < want or have % want:
            continue
        parts = have // want
        if d == merged:
            halves = out.chunk(2, dim=d)
            if any(h.shape[d] % parts for h in halves) or len(halves) != 2:
                return t
            out = torch.cat([h.chunk(parts, dim=d)[rank] for h in halves], dim=d)
        else:
            out = out.chunk(parts, dim=d)[rank]
    return out.contiguous()


def shard_tensors(tensors: dict[str, torch.Tensor], shapes: Mapping[str, Sequence[int]], rank: int,
                  merged: Callable[[str], Optional[int]] = expert_merged_dim) -> dict[str, torch.Tensor]:
    """Every tensor that has a parameter shape, cut for `rank`; `merged(name)` names its merged dim."""
    return {name: t if name not in shapes else shard_for_rank(t, shapes[name], rank, merged(name))
            for name, t in tensors.items()}
