"""One grouped-query attention module, the timed call: q/k/v projections, optional per-head q/k RMSNorm,
RoPE (neox pairing) on the first rope_dim dims of each head, the new K/V written into the paged cache,
paged SDPA (core.py), the optional sigmoid output gate, o_proj.

The gate packs into q_proj as Qwen3-Next writes it: q_proj's output is [heads, 2·head_dim] per token,
the query then the gate of each head; the attention output is multiplied by sigmoid(gate) before o_proj.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

import torch
import torch.nn.functional as F

from operatorx.backends.torch.attention.core import Chunk, attend
from operatorx.backends.torch.attention.proj import Projection
from operatorx.backends.torch.attention.rope import RopeTable, apply_rope
from operatorx.spec.attention import GqaArgs

__all__ = ["GqaWeights", "GqaModule", "RMS_EPS", "gqa_weights"]

#: RMSNorm's epsilon (Qwen3's q/k norm, DeepSeek's latent norms).
RMS_EPS = 1e-6


@dataclass
class GqaWeights:
    q: torch.Tensor                        # [heads·d (×2 with gate), hidden]
    k: torch.Tensor                        # [kv_heads·d, hidden]
    v: torch.Tensor                        # [kv_heads·d, hidden]
    o: torch.Tensor                        # [hidden, heads·d]
    q_norm: Optional[torch.Tensor] = None  # [d]
    k_norm: Optional[torch.Tensor] = None  # [d]

    def clone(self) -> GqaWeights:
        def copy(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return None if t is None else t.clone()

        return GqaWeights(self.q.clone(), self.k.clone(), self.v.clone(), self.o.clone(), copy(self.q_norm),
                          copy(self.k_norm))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for f in fields(self) if (t := getattr(self, f.name)) is not None)


def _linear(out_features: int, in_features: int, gen: torch.Generator, device: str) -> torch.Tensor:
    """A random bf16 weight [out, in] with unit-variance outputs (std 1/sqrt(in))."""
    w = torch.randn(out_features, in_features, generator=gen, device=device, dtype=torch.bfloat16)
    return w / in_features ** 0.5


def _norm(width: int, gen: torch.Generator, device: str) -> torch.Tensor:
    """An RMSNorm weight near 1 (random, so a wrong one shows in the check)."""
    return 1 + 0.1 * torch.randn(width, generator=gen, device=device, dtype=torch.bfloat16)


def gqa_weights(args: GqaArgs, gen: torch.Generator, device: str) -> GqaWeights:
    h, d = args.hidden, args.head_dim
    q_out = args.q_heads * d * (2 if args.gate else 1)
    kv = args.kv_heads * d
    w = GqaWeights(_linear(q_out, h, gen, device), _linear(kv, h, gen, device), _linear(kv, h, gen, device),
                   _linear(h, args.q_heads * d, gen, device))
    if args.qk_norm:
        w.q_norm, w.k_norm = _norm(d, gen, device), _norm(d, gen, device)
    return w


def rope_part(x: torch.Tensor, rope_dim: int, table: Optional[RopeTable]) -> torch.Tensor:
    """x [T, heads, d] with its first rope_dim dims rotated (the rest as they are)."""
    if table is None:
        return x
    if rope_dim == x.shape[-1]:
        return apply_rope(x, table)
    return torch.cat((apply_rope(x[..., :rope_dim], table), x[..., rope_dim:]), dim=-1)


class GqaModule:
    """The timed call over fixed inputs: `__call__` maps x [T, hidden] to the output [T, hidden]."""

    def __init__(self, args: GqaArgs, x: torch.Tensor, weights: GqaWeights, proj: dict[str, Projection],
                 k_cache: torch.Tensor, v_cache: torch.Tensor, write_slots: torch.Tensor, rope: RopeTable,
                 chunks: list[Chunk]):
        self.args, self.x, self.w, self.proj = args, x, weights, proj
        self.k_cache, self.v_cache = k_cache, v_cache      # [pool slots, kv_heads, d]
        self.write_slots, self.rope, self.chunks = write_slots, rope, chunks
        self.scale = args.head_dim ** -0.5

    def _kv(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_cache[index].transpose(1, 2), self.v_cache[index].transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, w, d = self.args, self.w, self.args.head_dim
        t = x.shape[0]
        q = self.proj["q_proj"](x).view(t, a.q_heads, -1)
        gate = None
        if a.gate:
            q, gate = q[..., :d], q[..., d:].reshape(t, a.q_heads * d)
        k = self.proj["k_proj"](x).view(t, a.kv_heads, d)
        v = self.proj["v_proj"](x).view(t, a.kv_heads, d)
        if w.q_norm is not None and w.k_norm is not None:
            q = F.rms_norm(q, (d,), w.q_norm, eps=RMS_EPS)
            k = F.rms_norm(k, (d,), w.k_norm, eps=RMS_EPS)
        q, k = rope_part(q, a.rope_dim, self.rope), rope_part(k, a.rope_dim, self.rope)
        self.k_cache.index_copy_(0, self.write_slots, k)
        self.v_cache.index_copy_(0, self.write_slots, v)
        out = attend(self.chunks, q, self._kv, self.scale)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return self.proj["o_proj"](out)

    def __call__(self) -> torch.Tensor:
        return self.forward(self.x)
