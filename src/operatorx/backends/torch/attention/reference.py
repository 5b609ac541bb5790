"""The fp32 reference of one gqa / mla module, request by request, from the cache as the backend holds it.

The rule: for a few requests of every batch group (the first and the last) and a few of each one's
new tokens (all when q <= REF_TOKENS, else the first and the last REF_TOKENS/2), recompute the
module in fp32 from the same bf16 weights and inputs: projections, norms, RoPE from its own fp64
angles, the attention as an explicit masked softmax over the request's keys (the cached ones the
backend's cache holds, given by `cached`, then the new tokens'), the gate, o_proj. MLA is computed
in its absorbed form (scores against the latent through kv_b_proj's key half, the output through its
value half), so it checks the backend's up-projected form by different arithmetic. Why requests
and rows: a prefill chunk's reference must stay cheap, and the first and last rows of the first
and last request of each group cover the shortest and the longest attention.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from operatorx.backends.torch.attention.gqa import RMS_EPS, GqaWeights
from operatorx.backends.torch.attention.layout import Layout, Request
from operatorx.backends.torch.attention.mla import MlaWeights, softmax_scale
from operatorx.backends.torch.attention.rope import Pairing, inv_freq, yarn_mscale
from operatorx.spec.attention import GqaArgs, MlaArgs, RopeScaling

__all__ = ["REF_TOKENS", "ReferenceRows", "CachedKv", "CachedLatent", "Activation", "gqa_reference", "mla_reference",
           "reference_requests"]

#: New tokens of a request the reference recomputes at most.
REF_TOKENS = 64

#: request -> fp32 (K, V) [ctx - key_start, kv_heads, d] of its cached positions, as the cache holds them.
CachedKv = Callable[[Request], tuple[torch.Tensor, torch.Tensor]]
#: request -> fp32 [ctx, kv_lora_rank + rope_dim]: its cached normed latents and rope keys.
CachedLatent = Callable[[Request], torch.Tensor]
#: x [rows, K] fp32 -> fp32 values as a projection's activation quantization leaves them.
Activation = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ReferenceRows:
    rows: torch.Tensor
    """int64 indices into the module's T output rows."""
    out: torch.Tensor
    """fp32 [len(rows), hidden]: the reference output of those rows."""
    what: str


def reference_requests(layout: Layout) -> list[Request]:
    """The first and the last request of every batch group."""
    picked: dict[int, Request] = {}
    for r in layout.requests:
        if r.group not in picked:
            picked[r.group] = r
    last: dict[int, Request] = {r.group: r for r in layout.requests}
    out: list[Request] = []
    for g in sorted(picked):
        out.append(picked[g])
        if last[g] is not picked[g]:
            out.append(last[g])
    return out


def _token_offsets(q: int) -> torch.Tensor:
    """Which of a request's q new tokens the reference recomputes."""
    if q <= REF_TOKENS:
        return torch.arange(q)
    half = REF_TOKENS // 2
    return torch.cat([torch.arange(half), torch.arange(q - half, q)])


def _rotate(x: torch.Tensor, positions: torch.Tensor, theta: float, scaling: Optional[RopeScaling],
            pairing: Pairing) -> torch.Tensor:
    """x [n, heads, rope_dim] fp32 rotated by its rows' positions (YaRN's mscale folded into cos/sin)."""
    rope_dim = x.shape[-1]
    angles = positions.to("cpu", torch.float64)[:, None] * inv_freq(rope_dim, theta, scaling)[None, :]
    scale = 1.0
    if scaling is not None:
        scale = yarn_mscale(scaling.factor, scaling.mscale or 1.0) / yarn_mscale(scaling.factor,
                                                                                 scaling.mscale_all_dim or 0.0)
    cos = (angles.cos() * scale).float().to(x.device)[:, None, :]
    sin = (angles.sin() * scale).float().to(x.device)[:, None, :]
    if pairing == "neox":
        half = rope_dim // 2
        a, b = x[..., :half], x[..., half:]
        return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)


def _softmax_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                    scale: float, window: Optional[int]) -> torch.Tensor:
    """q [n, heads, dk], k [L, heads, dk], v [L, heads, dv] fp32 -> [n, heads, dv]: each query over the keys
    at positions <= its own (and within the window)."""
    scores = torch.einsum("nhd,lhd->hnl", q, k) * scale
    allowed = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        allowed &= k_pos[None, :] > q_pos[:, None] - window
    scores = scores.masked_fill(~allowed[None], -math.inf)
    return torch.einsum("hnl,lhd->nhd", torch.softmax(scores, dim=-1), v)


def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight.float(), eps=RMS_EPS)


def _rope_part(x: torch.Tensor, rope_dim: int, positions: torch.Tensor, theta: float) -> torch.Tensor:
    if rope_dim == x.shape[-1]:
        return _rotate(x, positions, theta, None, "neox")
    return torch.cat((_rotate(x[..., :rope_dim], positions, theta, None, "neox"), x[..., rope_dim:]), dim=-1)


def _fp32(x: torch.Tensor) -> torch.Tensor:
    return x.float()


def gqa_reference(args: GqaArgs, w: GqaWeights, x: torch.Tensor, layout: Layout, cached: CachedKv,
                  act: Activation = _fp32) -> ReferenceRows:
    """The fp32 gqa module over the reference requests' chosen rows (module docstring); `act` is what the
    projections' activation quantization does to their inputs (none: fp32)."""
    d, heads, kv_heads = args.head_dim, args.q_heads, args.kv_heads
    wq, wk, wv, wo = w.q.float(), w.k.float(), w.v.float(), w.o.float()
    rows, outs = [], []
    for r in reference_requests(layout):
        xr = act(x[r.row0:r.row0 + r.q].float())
        pos_new = torch.arange(r.ctx, r.ctx + r.q, device=x.device)
        q = F.linear(xr, wq).view(r.q, heads, -1)
        gate = q[..., d:] if args.gate else None
        q = q[..., :d]
        k_new = F.linear(xr, wk).view(r.q, kv_heads, d)
        v_new = F.linear(xr, wv).view(r.q, kv_heads, d)
        if w.q_norm is not None and w.k_norm is not None:
            q, k_new = _rms(q, w.q_norm), _rms(k_new, w.k_norm)
        q = _rope_part(q, args.rope_dim, pos_new, args.rope_theta)
        k_new = _rope_part(k_new, args.rope_dim, pos_new, args.rope_theta)
        k_old, v_old = cached(r)
        k = torch.cat((k_old.to(x.device), k_new)).repeat_interleave(heads // kv_heads, dim=1)
        v = torch.cat((v_old.to(x.device), v_new)).repeat_interleave(heads // kv_heads, dim=1)
        k_pos = torch.arange(r.key_start, r.ctx + r.q, device=x.device)
        pick = _token_offsets(r.q).to(x.device)
        out = _softmax_attend(q[pick], k, v, pos_new[pick], k_pos, d ** -0.5, args.window)
        if gate is not None:
            out = out * torch.sigmoid(gate[pick])
        outs.append(F.linear(act(out.reshape(len(pick), heads * d)), wo))
        rows.append(pick + r.row0)
    return ReferenceRows(torch.cat(rows), torch.cat(outs),
                         "fp32 gqa per request: projections, norms, RoPE from fp64 angles, masked softmax over the "
                         "cached and new keys, gate, o_proj")


def mla_reference(args: MlaArgs, w: MlaWeights, x: torch.Tensor, layout: Layout, cached: CachedLatent,
                  act: Activation = _fp32, latent_quantized: Optional[Callable[[Request], bool]] = None
                  ) -> ReferenceRows:
    """The fp32 MLA module over the reference requests' chosen rows, in the absorbed form. `act`: the
    projections' activation quantization (none: fp32); `latent_quantized(request)`: whether the backend runs
    kv_b_proj as a layer over that request's latents (an up-projected prefill: they pass `act` too) rather
    than folding its weights into the query and output (the absorbed decode form)."""
    heads, r_rank, nope, rope_dim, dv = args.heads, args.kv_lora_rank, args.nope, args.rope_dim, args.v
    kv_b = w.kv_b.float().view(heads, nope + dv, r_rank)
    w_uk, w_uv = kv_b[:, :nope], kv_b[:, nope:]                       # [heads, nope, r], [heads, v, r]
    scale = softmax_scale(args)
    rows, outs = [], []
    for req in reference_requests(layout):
        xr = act(x[req.row0:req.row0 + req.q].float())
        pos_new = torch.arange(req.ctx, req.ctx + req.q, device=x.device)
        q_latent = _rms(F.linear(xr, w.q_a.float()), w.q_a_norm)
        q = F.linear(act(q_latent), w.q_b.float()).view(req.q, heads, nope + rope_dim)
        kv_a = F.linear(xr, w.kv_a.float())
        latent_new = _rms(kv_a[:, :r_rank], w.kv_a_norm)
        k_rope_new = kv_a[:, r_rank:]
        q_nope, q_rope = q[..., :nope], q[..., nope:]
        if args.rope and args.rope_theta is not None:
            q_rope = _rotate(q_rope, pos_new, args.rope_theta, args.rope_scaling, "interleaved")
            k_rope_new = _rotate(k_rope_new[:, None, :], pos_new, args.rope_theta, args.rope_scaling,
                                 "interleaved")[:, 0]
        old = cached(req).to(x.device)
        latent = torch.cat((old[:, :r_rank], latent_new))             # [L, r]
        if latent_quantized is not None and latent_quantized(req):
            latent = act(latent)
        k_rope = torch.cat((old[:, r_rank:], k_rope_new))             # [L, rope]
        pick = _token_offsets(req.q).to(x.device)
        q_absorbed = torch.einsum("nhd,hdr->nhr", q_nope[pick], w_uk)  # [n, heads, r]
        scores = (torch.einsum("nhr,lr->hnl", q_absorbed, latent)
                  + torch.einsum("nhd,ld->hnl", q_rope[pick], k_rope)) * scale
        k_pos = torch.arange(0, req.ctx + req.q, device=x.device)
        allowed = k_pos[None, :] <= pos_new[pick][:, None]
        probs = torch.softmax(scores.masked_fill(~allowed[None], -math.inf), dim=-1)
        mixed = torch.einsum("hnl,lr->nhr", probs, latent)              # [n, heads, r]
        out = torch.einsum("nhr,hvr->nhv", mixed, w_uv).reshape(len(pick), heads * dv)
        outs.append(F.linear(act(out), w.o.float()))
        rows.append(pick + req.row0)
    return ReferenceRows(torch.cat(rows), torch.cat(outs),
                         "fp32 MLA per request in the absorbed form (scores against the latent through kv_b's key "
                         "half, the output through its value half), RoPE from fp64 angles")
