"""One DeepSeek MLA module, the timed call, in its materialized (up-projected) form:

q_a_proj -> RMSNorm -> q_b_proj to heads x (nope + rope_dim); kv_a_proj_with_mqa -> [kv_lora_rank |
rope_dim], RMSNorm on the latent; RoPE (interleaved pairing, YaRN when rope_scaling says so) on the
rope dims of q and on the one shared rope key; the normed latent and the rope key written into the
paged cache (kv_lora_rank + rope_dim per token); per chunk the cached latents gathered and up-projected
by kv_b_proj to k_nope and v per head, K = [k_nope | rope key], SDPA with head dim nope + rope_dim and
value dim v (core.py), o_proj heads·v -> hidden.

The softmax scale is (nope + rope_dim)^-1/2, times mscale(factor, mscale_all_dim)² with YaRN
(vLLM's DeepseekV2 attention). The materialized form up-projects every gathered latent each call,
as vLLM's prefill path does; vLLM's decode path absorbs kv_b_proj into q and the output instead,
which the case's FLOP count takes when it is the cheaper (spec/attention.py), so a decode row's
TFLOP/s reads below what this path computes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

import torch
import torch.nn.functional as F

from operatorx.backends.torch.attention.core import Chunk, attend
from operatorx.backends.torch.attention.gqa import RMS_EPS, _linear, _norm
from operatorx.backends.torch.attention.proj import Projection
from operatorx.backends.torch.attention.rope import RopeTable, apply_rope, yarn_mscale
from operatorx.spec.attention import MlaArgs

__all__ = ["MlaWeights", "MlaModule", "mla_weights", "softmax_scale"]


@dataclass
class MlaWeights:
    q_a: torch.Tensor          # [q_lora_rank, hidden]
    q_a_norm: torch.Tensor     # [q_lora_rank]
    q_b: torch.Tensor          # [heads·(nope + rope_dim), q_lora_rank]
    kv_a: torch.Tensor         # [kv_lora_rank + rope_dim, hidden]
    kv_a_norm: torch.Tensor    # [kv_lora_rank]
    kv_b: torch.Tensor         # [heads·(nope + v), kv_lora_rank]
    o: torch.Tensor            # [hidden, heads·v]

    def clone(self) -> MlaWeights:
        return MlaWeights(**{f.name: getattr(self, f.name).clone() for f in fields(self)})

    def nbytes(self) -> int:
        return sum(getattr(self, f.name).numel() * getattr(self, f.name).element_size() for f in fields(self))


def mla_weights(args: MlaArgs, gen: torch.Generator, device: str) -> MlaWeights:
    h, heads, r = args.hidden, args.heads, args.kv_lora_rank
    return MlaWeights(
        q_a=_linear(args.q_lora_rank, h, gen, device), q_a_norm=_norm(args.q_lora_rank, gen, device),
        q_b=_linear(heads * (args.nope + args.rope_dim), args.q_lora_rank, gen, device),
        kv_a=_linear(r + args.rope_dim, h, gen, device), kv_a_norm=_norm(r, gen, device),
        kv_b=_linear(heads * (args.nope + args.v), r, gen, device), o=_linear(h, heads * args.v, gen, device))


def softmax_scale(args: MlaArgs) -> float:
    scale: float = (args.nope + args.rope_dim) ** -0.5
    s = args.rope_scaling
    if s is not None and s.mscale_all_dim:
        scale *= yarn_mscale(s.factor, s.mscale_all_dim) ** 2
    return scale


class MlaModule:
    """The timed call over fixed inputs: `__call__` maps x [T, hidden] to the output [T, hidden]."""

    def __init__(self, args: MlaArgs, x: torch.Tensor, weights: MlaWeights, proj: dict[str, Projection],
                 cache: torch.Tensor, write_slots: torch.Tensor, rope: Optional[RopeTable], chunks: list[Chunk]):
        self.args, self.x, self.w, self.proj = args, x, weights, proj
        self.cache = cache                                   # [pool slots, kv_lora_rank + rope_dim]
        self.write_slots, self.rope, self.chunks = write_slots, rope, chunks
        self.scale = softmax_scale(args)

    def _kv(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, r = self.args, self.args.kv_lora_rank
        cached = self.cache[index]                                        # [B, L, r + rope]
        b, keys = index.shape
        kv = self.proj["kv_b_proj"](cached[..., :r]).view(b, keys, a.heads, a.nope + a.v)
        k_rope = cached[..., None, r:].expand(b, keys, a.heads, a.rope_dim)
        k = torch.cat((kv[..., :a.nope], k_rope), dim=-1)
        return k.transpose(1, 2), kv[..., a.nope:].transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, w, r = self.args, self.w, self.args.kv_lora_rank
        t = x.shape[0]
        p = self.proj
        q_latent = F.rms_norm(p["q_a_proj"](x), (a.q_lora_rank,), w.q_a_norm, eps=RMS_EPS)
        q = p["q_b_proj"](q_latent).view(t, a.heads, a.nope + a.rope_dim)
        kv_a = p["kv_a_proj_with_mqa"](x)
        latent = F.rms_norm(kv_a[:, :r], (r,), w.kv_a_norm, eps=RMS_EPS)
        k_rope = kv_a[:, r:]
        if self.rope is not None:
            q = torch.cat((q[..., :a.nope], apply_rope(q[..., a.nope:], self.rope)), dim=-1)
            k_rope = apply_rope(k_rope[:, None, :], self.rope)[:, 0]
        self.cache.index_copy_(0, self.write_slots, torch.cat((latent, k_rope), dim=-1))
        out = attend(self.chunks, q, self._kv, self.scale)
        return p["o_proj"](out)

    def __call__(self) -> torch.Tensor:
        return self.forward(self.x)
