"""The fp32 reference of one DeepSeek-V4 attention (dsv4_attn) module, request by request, from the caches as held.

The rule, written from vLLM 0.26's DeepseekV4Attention on the FlashMLA path (models/deepseek_v4/attention.py,
compressor.py, nvidia/flashmla.py and the kernels in common/ops), for the rows reference.py's rule picks (the
first and last request of each batch group, the first and last REF_TOKENS/2 new tokens of each):
- q path: qr = RMSNorm(wq_a(x)) (q_norm), q = wq_b(qr) per head, a weightless RMSNorm per head, then RoPE.
- kv path: kv = RMSNorm(wkv(x)) (kv_norm), RoPE, stored in the SWA cache. One latent is K and V.
- RoPE: GPT-J pairing (dims 2i, 2i + 1) on the LAST rope_dim dims of each head_dim row, from
  compress_rope_theta at ratio > 1 (for every rope of the layer, window q/kv included), rope_theta
  otherwise; YaRN frequencies without its mscale (common/rope.py sets mscale and mscale_all_dim to 0).
- compressor (ratio r in 4, 128; coff = 2 at r 4, else 1): per new token, kv | score = x · [wkv | wgate]ᵀ
  in fp32 (bf16 weights, no quantization), score += ape[pos % r] (save_partial_states). At every position
  p with (p + 1) % r == 0 an entry pools positions p - coff·r + 1 .. p (those < 0 left out): the older r
  read the first head_dim columns of kv and score, the newer r the second; a softmax over the positions
  per column weighs kv; RMSNorm (norm); RoPE at position (p // r)·r; entry (p + 1) // r - 1
  (fused_compress_quant_cache.py:161-275).
- indexer (r 4): q = wq_b(qr) per index head with RoPE; its keys are its own compressor's entries over
  index_dim; score(token, entry) = Σ_h w_h · relu(q_h · k) with w = weights_proj(x) · index_dim^-1/2 ·
  index_heads^-1/2 (fused_indexer_q.py; the fp8 q scale folded into w cancels against the fp8 q) over the
  entries < (pos + 1) // 4; its top-k (torch.topk) as entry indices, -1 padding. `selection` replaces it.
- attention (FlashMLA sparse, head_dim^-1/2 scale): each token over its window (positions pos - window + 1
  .. pos) plus its compressed entries (r 4: the selected ones < (pos + 1) // 4; r 128: all entries <
  (pos + 1) // 128; r 0: none), with the per-head sink logit in the softmax's denominator only
  (out · exp(lse) / (exp(lse) + exp(sink))).
- output: inverse RoPE on the last rope_dim dims of each head's output at the token's position; heads in
  o_groups contiguous groups, z_g = wo_a_g · o_g (wo_a viewed [o_groups, o_lora_rank, heads·head_dim /
  o_groups]); out = wo_b(z).
- numerics vLLM changes values by, modelled as the reference's inputs: `act` is the block-FP8 projections'
  activation quantization (wq_a / wkv on x, wq_b and indexer.wq_b on qr, wo_a on the inverse-roped output,
  wo_b on z); `quantized` rounds this step's new cache rows as vLLM stores them (fp8_ds_mla: nope in e4m3 with
  a ue8m0 scale per 64 after a bf16 rounding, rope in bf16; index keys in e4m3 with one power-of-two scale
  per 128 after a bf16 rounding) and the index q as fused_indexer_q_rope_quant does (bf16, then e4m3 with a
  power-of-two scale per head).
Why: the compared output then differs from vLLM's by bf16 roundings and the attention's own arithmetic only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

from operatorx.backends.torch.attention.dsa_reference import Selection, overlap, top_k
from operatorx.backends.torch.attention.dsv4 import DSV4_NORM_EPS, CompressorWeights, Dsv4Weights
from operatorx.backends.torch.attention.layout import Layout, Request
from operatorx.backends.torch.attention.reference import Activation, _token_offsets, reference_requests
from operatorx.backends.torch.attention.rope import inv_freq
from operatorx.spec.attention import Dsv4AttnArgs, RopeScaling

__all__ = ["CachedRows", "Dsv4Cached", "Dsv4ReferenceRows", "Selection", "compress_entries", "compressor_states",
           "ds_mla_round_trip", "dsv4_reference", "dsv4_theta", "index_fp8_round_trip", "index_q_round_trip",
           "overlap", "rope_last", "top_k"]

#: request -> fp32 rows of one cache for that request (shapes in Dsv4Cached).
CachedRows = Callable[[Request], torch.Tensor]
_E4M3_MAX = 448.0
#: The smallest block amax the fp8 stores quantize by (the kernels' tl.maximum(absmax, 1e-4)).
_MIN_AMAX = 1e-4
#: fp8_ds_mla's nope quantization block (QUANT_BLOCK 64) and the index cache's (128).
DS_MLA_BLOCK = 64
INDEX_BLOCK = 128


@dataclass(frozen=True)
class Dsv4Cached:
    """What the caches hold for a request's ctx positions, dequantized to fp32 (dsv4_layout.read_cached).

    Each is a callable of the request (so a reader dequantizes only the reference requests); a request with
    ctx 0 gives [0, width] tensors.
    """

    window: CachedRows
    """fp32 [n, head_dim]: the SWA cache's rows of positions ctx - n .. ctx - 1 (normed, roped latents),
    n >= min(ctx, window - 1)."""
    compressed: Optional[CachedRows] = None
    """fp32 [ctx // ratio, head_dim]: the compressed entries 0 .. ctx // ratio - 1 (ratio 4 / 128)."""
    state: Optional[CachedRows] = None
    """fp32 [n, 2·coff·head_dim]: the compressor state rows ([kv | score + ape]) of positions ctx - n ..
    ctx - 1, n >= min(ctx, coff·ratio - 1) (fewer only when no boundary falls in this step)."""
    index_keys: Optional[CachedRows] = None
    """fp32 [ctx // 4, index_dim]: the indexer cache's keys (ratio 4)."""
    index_state: Optional[CachedRows] = None
    """fp32 [n, 2·coff·index_dim]: the indexer compressor's state rows, as `state`."""


@dataclass(frozen=True)
class Dsv4ReferenceRows:
    rows: torch.Tensor
    """int64 indices into the module's T output rows."""
    out: torch.Tensor
    """fp32 [len(rows), hidden]."""
    what: str
    own_indices: list[torch.Tensor] = field(default_factory=list)
    """Ratio 4, per reference request: int64 [n, min(topk, entries)] the reference's own top-k entries (-1: none)."""
    used_indices: list[torch.Tensor] = field(default_factory=list)
    """Ratio 4, per reference request: the entries the attention ran over (own_indices, or the given selection)."""
    invalid_picks: int = 0
    """Given entries (not -1) at or after their token's (pos + 1) // 4: a causality break the mask leaves out."""


def dsv4_theta(args: Dsv4AttnArgs) -> float:
    """The layer's rope theta: compress_rope_theta at ratio > 1, else rope_theta (common/rope.py:17-19)."""
    if args.compress_ratio > 1:
        assert args.compress_rope_theta is not None
        return args.compress_rope_theta
    return args.rope_theta


def rope_last(x: torch.Tensor, positions: torch.Tensor, rope_dim: int, theta: float,
              scaling: Optional[RopeScaling], inverse: bool = False) -> torch.Tensor:
    """x [n, ..., d] fp32 with its last rope_dim dims rotated GPT-J style (pairs 2i, 2i + 1) by each row's
    position (DeepseekV4ScalingRotaryEmbedding: YaRN frequencies, no mscale); `inverse` turns by -angle."""
    angles = positions.to("cpu", torch.float64)[:, None] * inv_freq(rope_dim, theta, scaling)[None, :]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (rope_dim // 2,)
    cos = angles.cos().float().to(x.device).view(shape)
    sin = angles.sin().float().to(x.device).view(shape)
    if inverse:
        sin = -sin
    rot = x[..., -rope_dim:]
    a, b = rot[..., 0::2], rot[..., 1::2]
    turned = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
    return torch.cat((x[..., :-rope_dim], turned), dim=-1)


def _pow2_scale(amax: torch.Tensor) -> torch.Tensor:
    return torch.exp2(torch.ceil(torch.log2(amax.clamp(min=_MIN_AMAX) / _E4M3_MAX)))


def _fp8_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """x [n, d] fp32 through e4m3 with one power-of-two scale per `block` columns (a partial last block too)."""
    n, d = x.shape
    padded = F.pad(x, (0, -d % block)).view(n, -1, block)
    scale = _pow2_scale(padded.abs().amax(dim=-1, keepdim=True))
    q = (padded / scale).clamp(-_E4M3_MAX, _E4M3_MAX).to(torch.float8_e4m3fn)
    return (q.float() * scale).view(n, -1)[:, :d]


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def ds_mla_round_trip(rows: torch.Tensor, rope_dim: int) -> torch.Tensor:
    """fp32 [n, head_dim] rows as the fp8_ds_mla cache gives them back: the nope part rounded to bf16, then
    e4m3 with a ue8m0 scale per 64 (amax floored at 1e-4), the rope part bf16 (cache_utils.py:153-216)."""
    nope = rows.shape[-1] - rope_dim
    return torch.cat((_fp8_blocks(_bf16(rows[:, :nope]), DS_MLA_BLOCK), _bf16(rows[:, nope:])), dim=-1)


def index_fp8_round_trip(rows: torch.Tensor) -> torch.Tensor:
    """fp32 [n, index_dim] index keys as the indexer cache gives them back: bf16, then e4m3 with one
    power-of-two fp32 scale per 128 (the head_dim 128 compressor kernel's single quant block)."""
    return _fp8_blocks(_bf16(rows), INDEX_BLOCK)


def index_q_round_trip(q: torch.Tensor) -> torch.Tensor:
    """fp32 [n, index_heads, index_dim] roped index q as fused_indexer_q_rope_quant leaves it: bf16, then e4m3
    with one power-of-two scale per token and head (its scale is folded into the head weights, so the
    product is the dequantized q's)."""
    n, ih, idim = q.shape
    return _fp8_blocks(_bf16(q).reshape(n * ih, idim), idim).view(n, ih, idim)


def compressor_states(cw: CompressorWeights, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """fp32 [n, 2·coff·head]: the state rows vLLM writes for hidden rows x [n, hidden] at `positions`:
    [kv | score + ape[pos % ratio]] with kv | score = x · fused_wkv_wgateᵀ in fp32 (save_partial_states)."""
    kv = x.float() @ cw.wkv.float().T
    score = x.float() @ cw.wgate.float().T + cw.ape.float()[positions.to(cw.ape.device) % cw.ratio]
    return torch.cat((kv, score), dim=-1)


def compress_entries(cw: CompressorWeights, states: torch.Tensor, first_position: int, boundaries: torch.Tensor,
                     rope_dim: int, theta: float, scaling: Optional[RopeScaling]) -> torch.Tensor:
    """fp32 [len(boundaries), head]: the entries the compressor writes at boundary positions p ((p + 1) %
    ratio == 0), from the state rows `states` of positions first_position .. (module docstring): pooled over
    p - coff·ratio + 1 .. p (positions < 0 left out), RMSNorm, RoPE at (p // ratio)·ratio. Before the store's
    quantization."""
    r, head, coff = cw.ratio, cw.head, cw.coff
    if boundaries.numel() == 0:
        return states.new_zeros(0, head)
    boundaries = boundaries.to(states.device)
    offsets = torch.arange(coff * r, device=states.device)
    positions = boundaries[:, None] - coff * r + 1 + offsets[None, :]                 # [B, coff·r]
    valid = positions >= 0
    earliest = int(positions.clamp(min=0).min())
    if earliest < first_position:
        raise ValueError(f"compressor state: position {earliest} is needed for an entry but the state rows start "
                         f"at {first_position}")
    rows = (positions.clamp(min=0) - first_position).clamp(max=states.shape[0] - 1)
    half = (offsets // r).expand_as(positions)                                         # 0: the older r (coff 2)
    split = states.view(states.shape[0], 2, coff, head)                                # [n, kv | score, coff, head]
    kv = split[rows, 0, half]                                                          # [B, coff·r, head]
    score = split[rows, 1, half].masked_fill(~valid[..., None], -math.inf)
    pooled = (kv * torch.softmax(score, dim=1)).sum(dim=1)
    entries = F.rms_norm(pooled, (head,), cw.norm.float(), eps=DSV4_NORM_EPS)
    entry_pos = (boundaries // r) * r
    return rope_last(entries, entry_pos, rope_dim, theta, scaling)


def _fp32(x: torch.Tensor) -> torch.Tensor:
    return x.float()


def _new_entries(args: Dsv4AttnArgs, cw: CompressorWeights, cached_entries: Optional[CachedRows],
                 cached_state: Optional[CachedRows], req: Request, x: torch.Tensor, pos: torch.Tensor,
                 store: Callable[[torch.Tensor], torch.Tensor], name: str) -> torch.Tensor:
    """All the request's entries after this step: the cached ones, then those this step's boundaries write."""
    if cached_entries is None:
        raise ValueError(f"cached.{name}: required at compress_ratio {args.compress_ratio}")
    old = cached_entries(req).to(x.device).float()
    if old.shape[0] != req.ctx // cw.ratio:
        raise ValueError(f"cached.{name}: {old.shape[0]} entries for ctx {req.ctx}, expected {req.ctx // cw.ratio}")
    boundaries = pos[(pos + 1) % cw.ratio == 0]
    if boundaries.numel() == 0:
        return old
    state_name = "index_state" if name == "index_keys" else "state"
    if cached_state is None:
        raise ValueError(f"cached.{state_name}: required at compress_ratio {args.compress_ratio}")
    old_state = cached_state(req).to(x.device).float()
    states = torch.cat((old_state, compressor_states(cw, x, pos)))
    new = compress_entries(cw, states, req.ctx - old_state.shape[0], boundaries, args.rope_dim, dsv4_theta(args),
                           args.rope_scaling)
    return torch.cat((old, store(new)))


def _index_scores(args: Dsv4AttnArgs, w: Dsv4Weights, x: torch.Tensor, qr: torch.Tensor, q_pos: torch.Tensor,
                  keys: torch.Tensor, act: Activation, quantized: bool) -> torch.Tensor:
    """fp32 [n, entries] indexer scores (module docstring); -inf at entries >= (pos + 1) // 4."""
    assert w.indexer is not None and args.index_heads is not None and args.index_dim is not None
    ih, idim = args.index_heads, args.index_dim
    q = (act(qr) @ w.indexer.wq_b.float().T).view(-1, ih, idim)
    q = rope_last(q, q_pos, args.rope_dim, dsv4_theta(args), args.rope_scaling)
    if quantized:
        q = index_q_round_trip(q)
    head_w = x @ w.indexer.weights_proj.float().T * idim ** -0.5 * ih ** -0.5
    scores = torch.zeros(q.shape[0], keys.shape[0], device=x.device, dtype=torch.float32)  # the check runs under bf16
    for h in range(ih):
        scores += head_w[:, h, None] * torch.relu(q[:, h] @ keys.T)
    allowed = torch.arange(keys.shape[0], device=x.device)[None, :] < ((q_pos + 1) // 4)[:, None]
    return scores.masked_fill(~allowed, -math.inf)


def _attend(q: torch.Tensor, keys: torch.Tensor, sink: torch.Tensor, scale: float) -> torch.Tensor:
    """q [heads, d], keys [L, d] (K = V) -> [heads, d]: softmax with the sink logit in the denominator."""
    logits = (q @ keys.T) * scale
    full = torch.cat((logits, sink[:, None]), dim=-1)
    probs = torch.softmax(full, dim=-1)[:, :-1]
    return probs @ keys


def dsv4_reference(args: Dsv4AttnArgs, weights: Dsv4Weights, x: torch.Tensor, layout: Layout, cached: Dsv4Cached,
                   act: Optional[Activation] = None, selection: Optional[Selection] = None,
                   quantized: bool = True) -> Dsv4ReferenceRows:
    """The fp32 dsv4_attn module over the reference requests' chosen rows (module docstring). x: [T, hidden]
    in batch (layout) order; `cached`: the caches read back; `act`: the block-FP8 projections' activation
    quantization (None: none); `selection` (ratio 4): the attended entry indices instead of the reference's
    top-k, given (request, new-token offsets [n]) as int64 [n, k] (-1: none); `quantized`: round this step's
    new cache rows and the index q as vLLM stores them (False: plain fp32, for exact checks)."""
    a = act or _fp32
    w = weights
    heads, hd, rope, window, r = args.heads, args.head_dim, args.rope_dim, args.window, args.compress_ratio
    theta, scaling = dsv4_theta(args), args.rope_scaling
    keep_main: Callable[[torch.Tensor], torch.Tensor] = (
        (lambda t: ds_mla_round_trip(t, rope)) if quantized else (lambda t: t))
    keep_index: Callable[[torch.Tensor], torch.Tensor] = index_fp8_round_trip if quantized else (lambda t: t)
    g, hpg = args.o_groups, heads // args.o_groups
    wo_a = w.wo_a.float().view(g, args.o_lora_rank, hpg * hd)
    scale = hd ** -0.5
    sink = w.attn_sink.float().to(x.device)
    rows, outs, owns, useds, invalid = [], [], [], [], 0
    for req in reference_requests(layout):
        xr = x[req.row0:req.row0 + req.q].float()
        pos = torch.arange(req.ctx, req.ctx + req.q, device=x.device)
        xa = a(xr)
        qr = F.rms_norm(xa @ w.wq_a.float().T, (args.q_lora_rank,), w.q_norm.float(), eps=DSV4_NORM_EPS)
        kv = F.rms_norm(xa @ w.wkv.float().T, (hd,), w.kv_norm.float(), eps=DSV4_NORM_EPS)
        kv_new = keep_main(rope_last(kv, pos, rope, theta, scaling))
        old_window = cached.window(req).to(x.device).float()
        n_old = min(req.ctx, window - 1)
        if old_window.shape[0] < n_old:
            raise ValueError(f"cached.window: {old_window.shape[0]} rows for ctx {req.ctx}, window {window} needs "
                             f"{n_old}")
        window_rows = torch.cat((old_window[old_window.shape[0] - n_old:], kv_new))   # positions ctx - n_old ..
        pick = _token_offsets(req.q).to(x.device)
        q = (a(qr[pick]) @ w.wq_b.float().T).view(len(pick), heads, hd)
        q = F.rms_norm(q, (hd,), eps=DSV4_NORM_EPS)
        q = rope_last(q, pos[pick], rope, theta, scaling)
        entries = None
        used = None
        if r > 1:
            if w.compressor is None:
                raise ValueError("weights.compressor: required at compress_ratio > 1")
            entries = _new_entries(args, w.compressor, cached.compressed, cached.state, req, xr, pos, keep_main,
                                   "compressed")
        if r == 4:
            if w.indexer is None or args.topk is None:
                raise ValueError("weights.indexer and topk: required at compress_ratio 4")
            index_keys = _new_entries(args, w.indexer.compressor, cached.index_keys, cached.index_state, req, xr,
                                      pos, keep_index, "index_keys")
            scores = _index_scores(args, w, xr[pick], qr[pick], pos[pick], index_keys, a, quantized)
            own = top_k(scores, args.topk)
            used = own if selection is None else selection(req, pick).to(x.device, torch.int64)
            limit = ((pos[pick] + 1) // 4)[:, None]
            invalid += int(((used >= 0) & (used >= limit)).sum())
            owns.append(own)
            useds.append(used)
        out_rows = []
        for i, off in enumerate(pick.tolist()):
            p = req.ctx + off
            lo = max(0, p - window + 1)
            keys = window_rows[lo - (req.ctx - n_old):p + 1 - (req.ctx - n_old)]
            if entries is not None:
                allowed = (p + 1) // r
                if used is not None:
                    picked = used[i]
                    picked = torch.unique(picked[(picked >= 0) & (picked < allowed)])
                    keys = torch.cat((keys, entries[picked]))
                else:
                    keys = torch.cat((keys, entries[:allowed]))
            out_rows.append(_attend(q[i], keys, sink, scale))
        o = rope_last(torch.stack(out_rows), pos[pick], rope, theta, scaling, inverse=True)  # [n, heads, hd]
        z = torch.einsum("ngk,grk->ngr", a(o.reshape(len(pick), heads * hd)).view(len(pick), g, hpg * hd), wo_a)
        outs.append(a(z.reshape(len(pick), g * args.o_lora_rank)) @ w.wo_b.float().T)
        rows.append(pick + req.row0)
    kind = {0: "window only", 128: "window + every compressed entry (ratio 128)"}.get(
        r, f"window + {'the given selection' if selection is not None else 'its own top-k'} of the ratio-4 "
           f"entries (topk {args.topk})")
    what = (f"fp32 DeepSeek-V4 attention per request: {kind}, window {window}, sink, K = V one latent, GPT-J RoPE "
            f"on the last {rope} dims from fp64 angles, grouped wo_a, "
            f"{'fp8 stores modelled' if quantized else 'no fp8 stores'}")
    return Dsv4ReferenceRows(torch.cat(rows), torch.cat(outs), what, owns, useds, invalid)
