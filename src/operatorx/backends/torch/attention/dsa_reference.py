"""The fp32 reference of one DeepSeek-V3.2 (mla_dsa) module, request by request, from the caches as held.

The rule, written from vLLM 0.26's code, for the rows reference.py's rule picks (the first and last
request of each group, the first and last REF_TOKENS/2 new tokens of each):
- MLA projections as mla_reference computes them (q_a_proj -> RMSNorm = the q latent -> q_b_proj;
  kv_a_proj_with_mqa -> RMSNorm on the latent; interleaved RoPE with YaRN on q's rope part and the
  rope key).
- the indexer (deepseek_v2.Indexer.forward, its unfused branch): q = wq_b(q latent) per index head,
  k = LayerNorm(wk(x)) (weight and bias, eps 1e-6), RoPE on the first rope_dim dims of both (neox
  pairing: `indexer_rope_emb` has is_neox_style = not indexer_rope_interleave, which the config
  leaves unset), head weights = weights_proj(x) · index_dim^-1/2 · index_heads^-1/2 (the q fp8 scale
  vLLM folds in as well cancels against its fp8 q); score(token, key) = Σ_h w_h · relu(q_h · k)
  (DeepGEMM's fp8_mqa_logits / fp8_paged_mqa_logits), over the request's keys at positions <= the
  token's (causal), the cached keys read back from the indexer cache (`cached_keys`).
- `indexer: reuse` (a layer that reads an earlier layer's top-k): no indexer; the given selection is attended.
- selection: each token's topk highest-scoring keys (torch.topk; fewer allowed keys than topk: all of
  them), as token positions within the request, -1 padding (what sparse_attn_indexer writes into
  topk_indices_buffer). `selection` replaces it by given indices (vLLM's, read back from that buffer),
  so the attention is checked on vLLM's own picks; `own_indices` keeps the reference's for `overlap`.
- the absorbed MLA attention of mla_reference, its softmax over the selected keys only.
Why: the fp8 indexer keys make near-tied scores order differently, so the attention is compared on one
selection and the selections are compared apart.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from operatorx.backends.torch.attention.dsa import INDEX_NORM_EPS, DsaWeights, mla_args
from operatorx.backends.torch.attention.layout import Layout, Request
from operatorx.backends.torch.attention.mla import softmax_scale
from operatorx.backends.torch.attention.reference import (
    Activation,
    CachedLatent,
    _rms,
    _rotate,
    _token_offsets,
    reference_requests,
)
from operatorx.spec.attention import MlaDsaArgs

__all__ = ["CachedIndexKeys", "Selection", "DsaReferenceRows", "dsa_reference", "index_keys", "index_scores",
           "top_k", "overlap"]

#: request -> fp32 [ctx, index_dim]: its cached indexer keys (normed, rotated) as the indexer cache holds them.
CachedIndexKeys = Callable[[Request], torch.Tensor]
#: (request, the new-token offsets the reference recomputes [n]) -> int64 [n, k] selected token positions of
#: the request (-1: none).
Selection = Callable[[Request, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class DsaReferenceRows:
    rows: torch.Tensor
    """int64 indices into the module's T output rows."""
    out: torch.Tensor
    """fp32 [len(rows), hidden]."""
    what: str
    own_indices: list[torch.Tensor]
    """Per reference request: int64 [n, min(topk, keys)] the reference's own top-k positions (-1: none)."""
    used_indices: list[torch.Tensor]
    """Per reference request: the positions the attention ran over (own_indices, or the given selection's)."""
    invalid_picks: int
    """Given positions (not -1) after their token's own position: a causality break the mask leaves out."""


def _fp32(x: torch.Tensor) -> torch.Tensor:
    return x.float()


def index_keys(args: MlaDsaArgs, w: DsaWeights, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """fp32 [n, index_dim]: the indexer keys of rows x [n, hidden] at positions pos, as vLLM writes them into
    its cache before fp8: LayerNorm(wk(x)), its first rope_dim dims rotated (neox pairing)."""
    idim, rope = args.index_dim, args.rope_dim
    k = F.layer_norm(F.linear(x, w.wk.float()), (idim,), w.k_norm.float(), w.k_norm_bias.float(),
                     eps=INDEX_NORM_EPS)
    k_rot = _rotate(k[:, None, :rope], pos, args.rope_theta, args.rope_scaling, "neox")[:, 0]
    return torch.cat((k_rot, k[:, rope:]), dim=-1)


def index_scores(args: MlaDsaArgs, w: DsaWeights, x: torch.Tensor, q_latent: torch.Tensor, q_pos: torch.Tensor,
                 keys: torch.Tensor, act: Activation = _fp32) -> torch.Tensor:
    """fp32 [n, L] indexer scores (module docstring) of the tokens with hidden rows x [n, hidden], q latents
    [n, q_lora_rank] and positions q_pos over the request's keys [L, index_dim] (positions 0 .. L - 1); -inf
    where a key is after the token. `act`: wq_b's input quantization (wk and weights_proj are vLLM's bf16
    wk_weights_proj, unquantized). One index head at a time, so a long context stays [n, L]."""
    ih, idim, rope = args.index_heads, args.index_dim, args.rope_dim
    q = F.linear(act(q_latent), w.wq_b.float()).view(-1, ih, idim)
    q = torch.cat((_rotate(q[..., :rope], q_pos, args.rope_theta, args.rope_scaling, "neox"), q[..., rope:]), -1)
    head_w = F.linear(x, w.weights_proj.float()) * idim ** -0.5 * ih ** -0.5  # [n, ih]
    scores = torch.zeros(q.shape[0], keys.shape[0], device=x.device, dtype=torch.float32)   # fp32 under any default
    for h in range(ih):
        scores += head_w[:, h, None] * torch.relu(q[:, h] @ keys.T)
    k_pos = torch.arange(keys.shape[0], device=x.device)
    return scores.masked_fill(k_pos[None, :] > q_pos[:, None], -math.inf)


def top_k(scores: torch.Tensor, topk: int) -> torch.Tensor:
    """int64 [n, min(topk, L)]: each row's highest-scoring key positions, -1 where the row has fewer
    allowed (finite) keys than that."""
    values, idx = torch.topk(scores, min(topk, scores.shape[-1]), dim=-1)
    return idx.masked_fill(torch.isinf(values) & (values < 0), -1)


def overlap(own: torch.Tensor, other: torch.Tensor) -> float:
    """The share of own's selected positions (not -1) that other also selects, over all rows."""
    hits, total = 0, 0
    for a, b in zip(own.tolist(), other.tolist(), strict=True):
        mine = {i for i in a if i >= 0}
        hits += len(mine & {i for i in b if i >= 0})
        total += len(mine)
    return hits / total if total else 1.0


def _selected_mask(indices: torch.Tensor, keys: int) -> torch.Tensor:
    """bool [n, keys]: True at each row's selected positions (-1 and positions >= keys ignored)."""
    valid = (indices >= 0) & (indices < keys)
    mask = torch.zeros(indices.shape[0], keys + 1, dtype=torch.bool, device=indices.device)
    mask.scatter_(1, torch.where(valid, indices, keys), True)
    return mask[:, :keys]


def dsa_reference(args: MlaDsaArgs, w: DsaWeights, x: torch.Tensor, layout: Layout, cached: CachedLatent,
                  cached_keys: Optional[CachedIndexKeys], act: Activation = _fp32,
                  selection: Optional[Selection] = None,
                  latent_quantized: Optional[Callable[[Request], bool]] = None) -> DsaReferenceRows:
    """The fp32 mla_dsa module over the reference requests' chosen rows (module docstring). `cached`: the
    latent cache read back ([ctx, kv_lora_rank + rope_dim]); `cached_keys`: the indexer cache read back;
    `act`, `latent_quantized`: as mla_reference's; `selection`: the attended positions to use instead of the
    reference's own top-k; an `indexer: reuse` layer runs no indexer and attends `selection` (needed), which
    is then its own_indices too."""
    m, mw = mla_args(args), w.mla
    heads, r_rank, nope, rope_dim, dv = args.heads, args.kv_lora_rank, args.nope, args.rope_dim, args.v
    kv_b = mw.kv_b.float().view(heads, nope + dv, r_rank)
    w_uk, w_uv = kv_b[:, :nope], kv_b[:, nope:]
    scale = softmax_scale(m)
    rows, outs, owns, useds, invalid = [], [], [], [], 0
    for req in reference_requests(layout):
        xr = act(x[req.row0:req.row0 + req.q].float())
        pos_new = torch.arange(req.ctx, req.ctx + req.q, device=x.device)
        q_latent = _rms(F.linear(xr, mw.q_a.float()), mw.q_a_norm)
        q = F.linear(act(q_latent), mw.q_b.float()).view(req.q, heads, nope + rope_dim)
        kv_a = F.linear(xr, mw.kv_a.float())
        latent_new = _rms(kv_a[:, :r_rank], mw.kv_a_norm)
        q_rope = _rotate(q[..., nope:], pos_new, args.rope_theta, args.rope_scaling, "interleaved")
        k_rope_new = _rotate(kv_a[:, None, r_rank:], pos_new, args.rope_theta, args.rope_scaling,
                             "interleaved")[:, 0]
        old = cached(req).to(x.device)
        latent = torch.cat((old[:, :r_rank], latent_new))
        if latent_quantized is not None and latent_quantized(req):
            latent = act(latent)
        k_rope = torch.cat((old[:, r_rank:], k_rope_new))
        pick = _token_offsets(req.q).to(x.device)
        if args.indexer == "reuse":
            if selection is None:
                raise ValueError("an `indexer: reuse` layer attends a given selection (an earlier layer's top-k)")
            own = used = selection(req, pick).to(x.device, torch.int64)
        else:
            if cached_keys is None:
                raise ValueError("an own indexer scores the cached indexer keys: cached_keys is needed")
            x_index = x[req.row0:req.row0 + req.q].float()                    # wk_weights_proj: bf16 input
            keys_index = torch.cat((cached_keys(req).to(x.device), index_keys(args, w, x_index, pos_new)))
            scores = index_scores(args, w, x_index[pick], q_latent[pick], pos_new[pick], keys_index, act)
            own = top_k(scores, args.topk)
            used = own if selection is None else selection(req, pick).to(x.device, torch.int64)
        keys = req.ctx + req.q
        invalid += int(((used >= 0) & (used > pos_new[pick][:, None])).sum())
        allowed = _selected_mask(used, keys) & (torch.arange(keys, device=x.device)[None, :]
                                                <= pos_new[pick][:, None])
        q_absorbed = torch.einsum("nhd,hdr->nhr", q[pick][..., :nope], w_uk)
        logits = (torch.einsum("nhr,lr->hnl", q_absorbed, latent)
                  + torch.einsum("nhd,ld->hnl", q_rope[pick], k_rope)) * scale
        probs = torch.softmax(logits.masked_fill(~allowed[None], -math.inf), dim=-1)
        mixed = torch.einsum("hnl,lr->nhr", probs, latent)
        out = torch.einsum("nhr,hvr->nhv", mixed, w_uv).reshape(len(pick), heads * dv)
        outs.append(F.linear(act(out), mw.o.float()))
        rows.append(pick + req.row0)
        owns.append(own)
        useds.append(used)
    given = "the given selection" if selection is not None else "its own top-k"
    indexer = ("no indexer (reuse: an earlier layer's top-k)" if args.indexer == "reuse"
               else "the indexer (relu(q·k) weighted over index heads, causal)")
    return DsaReferenceRows(torch.cat(rows), torch.cat(outs),
                            f"fp32 DeepSeek-V3.2 per request: {indexer}, absorbed MLA over {given} "
                            f"(topk {args.topk}), RoPE from fp64 angles", owns, useds, invalid)
