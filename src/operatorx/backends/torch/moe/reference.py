"""The fp32 reference for one MoE layer, written apart from the op's code path.

What it checks, on the first `rows` tokens:
1. the gate GEMM against an fp32 matmul of the same inputs;
2. the op's expert choice: from the op's own logits (upcast), the scores are recomputed here
   and every token's choice must be a valid top-k of them (ties within `TIE_TOL` accepted),
   respect the group limit (grouped_topk), equal the hash table (hash) or the forced ids;
   a token whose choice is wrong fails the check (and is computed here with the reference's
   own choice, so the output error is reported too);
3. the output: a per-expert fp32 loop (gather the expert's tokens, fp32 GEMMs with the same
   weights, dequantized for fp8, with the activations quantize-dequantized where the case
   quantizes them), weighted by fp32 router weights, plus latent projections and shared experts.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

import torch

from operatorx.backends.base import Check
from operatorx.backends.check import rel_error
from operatorx.backends.torch.moe.activation import apply_activation
from operatorx.backends.torch.quant import dequantize, quantize
from operatorx.spec.moe import GroupedTopK, HashSelect
from operatorx.spec.operand import Scale

if TYPE_CHECKING:
    from operatorx.backends.torch.moe.layer import MoeLayer
    from operatorx.backends.torch.moe.router import RouterOutput

__all__ = ["check_layer", "reference_scores", "valid_choice", "REL_ERROR_BOUND", "TIE_TOL"]

#: ||out - ref|| / ||ref||: bf16 layers round at each of ~4 steps; fp8 ones re-quantize the
#: intermediate, where a one-ulp flip of e4m3 (12.5%) on a few elements is expected.
REL_ERROR_BOUND = {"bf16": 1e-2, "fp8_rowwise": 5e-2}
TIE_TOL = 1e-5


def reference_scores(logits: torch.Tensor, kind: str) -> torch.Tensor:
    x = logits.double()
    if kind == "softmax":
        z = torch.exp(x - x.max(dim=-1, keepdim=True).values)
        return (z / z.sum(dim=-1, keepdim=True)).float()
    if kind == "sigmoid":
        return (1.0 / (1.0 + torch.exp(-x))).float()
    if kind == "sqrtsoftplus":
        return torch.sqrt(torch.where(x > 30, x, torch.log1p(torch.exp(x)))).float()
    raise ValueError(kind)


def _kth(v: torch.Tensor, k: int) -> torch.Tensor:
    return v.sort(dim=-1, descending=True).values[..., k - 1]


def valid_choice(choice: torch.Tensor, ids: torch.Tensor, k: int, grouped: Optional[GroupedTopK],
                 biased: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(valid [T] bool, the reference's own choice [T, k]) for top-k / grouped top-k routing."""
    tokens, experts = choice.shape
    allowed = torch.ones_like(choice, dtype=torch.bool)
    if grouped is not None:
        g = choice.view(tokens, grouped.groups, -1)
        gs = g.sort(dim=-1, descending=True).values
        group_score = gs[..., :2].sum(-1) if biased and gs.shape[-1] >= 2 else gs[..., 0]
        own_groups = group_score.sort(dim=-1, descending=True).indices[:, :grouped.topk_groups]
        own_mask = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, own_groups, True)
        ok_groups = group_score >= _kth(group_score, grouped.topk_groups).unsqueeze(1) - TIE_TOL
        allowed = ok_groups.repeat_interleave(experts // grouped.groups, dim=1)
        own_choice = choice.masked_fill(~own_mask.repeat_interleave(experts // grouped.groups, dim=1), -math.inf)
    else:
        own_choice = choice
    own = own_choice.sort(dim=-1, descending=True).indices[:, :k]
    masked = choice.masked_fill(~allowed, -math.inf)
    thresh = _kth(masked, k).unsqueeze(1) - TIE_TOL
    picked = masked.gather(1, ids)
    distinct = ids.sort(dim=-1).values.diff(dim=-1).ne(0).all(dim=-1) if k > 1 else torch.ones(tokens, dtype=torch.bool,
                                                                                              device=ids.device)
    return (picked >= thresh).all(dim=-1) & distinct, own


def _qdq(x: torch.Tensor, scale: Optional[Scale]) -> torch.Tensor:
    if scale is None:
        return x
    q, s = quantize(x, "e4m3", scale, weight=False)
    rows, cols = x.shape
    return dequantize(q, s, scale.block(rows, cols, weight=False))


def _routing(layer: MoeLayer, routed: RouterOutput, rows: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(ids the reference uses [rows, k], fp32 weights [rows, k], tokens whose op choice was wrong)."""
    args, rw = layer.args, layer.router.w
    k, sel = args.experts.top_k, args.router.select
    scores = reference_scores(routed.logits[:rows], args.router.scoring)
    ids = routed.ids[:rows]
    if layer.router.forced is not None:
        want = layer.router.forced[:rows]
        ok = (ids == want).all(dim=-1)
    elif isinstance(sel, HashSelect):
        assert rw.hash_table is not None and rw.token_ids is not None
        want = rw.hash_table[rw.token_ids[:rows]]
        ok = (ids.sort(dim=-1).values == want.sort(dim=-1).values).all(dim=-1)
    else:
        choice = scores if rw.correction_bias is None else scores + rw.correction_bias
        ok, want = valid_choice(choice, ids, k, sel if isinstance(sel, GroupedTopK) else None,
                                rw.correction_bias is not None)
    use = torch.where(ok.unsqueeze(1), ids, want)
    w = scores.gather(1, use)
    if args.router.renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    if args.router.scale is not None:
        w = w * args.router.scale
    return use, w, int((~ok).sum())


def _experts(layer: MoeLayer, x_e: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    ex = layer.experts
    on_input = ex.weight_on_input
    out = torch.zeros_like(x_e)
    for e in torch.unique(ids).tolist():
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        wt = w[tok, slot].unsqueeze(1)
        if e >= ex.w.num and ex.remote:     # an expert another rank holds
            continue
        if e >= ex.w.num:           # zero expert: its input, weighted
            out.index_add_(0, tok, wt * x_e[tok])
            continue
        a = _qdq(x_e[tok] * wt if on_input else x_e[tok], ex.a1_scale)
        w1 = ex.w.w1[e].float() if ex.w.s1 is None else ex.w.w1[e].float() * ex.w.s1[e].unsqueeze(1)
        w2 = ex.w.w2[e].float() if ex.w.s2 is None else ex.w.w2[e].float() * ex.w.s2[e].unsqueeze(1)
        h = a @ w1.T
        if ex.w.b1 is not None:
            h = h + ex.w.b1[e].float()
        y = _qdq(apply_activation(h, ex.act), ex.a2_scale) @ w2.T
        if ex.w.b2 is not None:
            y = y + ex.w.b2[e].float()
        out.index_add_(0, tok, y if on_input else wt * y)
    return out


def _shared(layer: MoeLayer, x: torch.Tensor) -> torch.Tensor:
    sh = layer.shared
    assert sh is not None
    scale = sh.fp8_scales[0] if sh.fp8_scales is not None else None
    w1 = sh.w.w1.float() if sh.w.s1 is None else sh.w.w1.float() * sh.w.s1.unsqueeze(1)
    w2 = sh.w.w2.float() if sh.w.s2 is None else sh.w.w2.float() * sh.w.s2.unsqueeze(1)
    y = _qdq(apply_activation(_qdq(x, scale) @ w1.T, sh.act), scale) @ w2.T
    if sh.w.gate is not None:
        y = y * torch.sigmoid(x @ sh.w.gate.float().T)
    return y


def check_layer(layer: MoeLayer, out: torch.Tensor, routed: RouterOutput, max_rows: int) -> Check:
    args = layer.args
    rows = min(args.tokens, max_rows)
    x = layer.x[:rows].float()
    logits_ref = x @ layer.router.w.gate.float().T
    logits_err = rel_error(routed.logits[:rows], logits_ref)
    ids, w, wrong = _routing(layer, routed, rows)
    x_e = x
    lat = layer.latent
    if lat is not None:
        x_e = x @ lat.down.float().T
        if lat.norm is not None:
            x_e = x_e * torch.rsqrt(x_e.pow(2).mean(dim=-1, keepdim=True) + 1e-6) * lat.norm.float()
    ref = _experts(layer, x_e, ids, w)
    if lat is not None:
        ref = ref @ lat.up.float().T
    if layer.shared is not None:
        ref = ref + _shared(layer, x)
    out_err = rel_error(out[:rows], ref)
    scheme = "fp8_rowwise" if layer.experts.fp8 or (layer.shared and layer.shared.fp8_scales) else "bf16"
    # a token routed to experts that are not a valid top-k pick is a wrong result by itself
    worst = max(out_err, logits_err) if wrong == 0 else math.inf
    return Check(worst, REL_ERROR_BOUND[scheme], rows,
                 f"fp32 per-expert loop (router logits rel err {logits_err:.2g}, output rel err {out_err:.2g}; "
                 f"{wrong} of {rows} tokens' expert choice was not a valid pick and was replaced)")
