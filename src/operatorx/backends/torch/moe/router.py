"""The router: gate GEMM → scores → selection → weights, all inside the timed call.

Scores are computed in fp32 from the logits (as serving engines do). Selection uses the
scores plus the correction bias when there is one; the weights are the scores without it
(DeepSeek-V3's rule), optionally renormalized over the k picks and multiplied by `scale`.
A forced distribution (routing.py) replaces the selected ids after the router has run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from operatorx.spec.moe import GroupedTopK, HashSelect, Router

__all__ = ["RouterWeights", "RouterOutput", "TorchRouter", "score", "select_grouped", "finish_weights"]


@dataclass
class RouterWeights:
    gate: torch.Tensor                         # [E + Z, H], bf16 or fp32
    correction_bias: Optional[torch.Tensor]    # [E + Z] fp32
    hash_table: Optional[torch.Tensor] = None  # [vocab, k] int64: token id → experts
    token_ids: Optional[torch.Tensor] = None   # [T] int64: the tokens' ids, for hash routing


@dataclass
class RouterOutput:
    ids: torch.Tensor        # [T, k] int64
    weights: torch.Tensor    # [T, k] fp32
    logits: torch.Tensor     # [T, E + Z] as the gate produced them


def score(logits: torch.Tensor, kind: str) -> torch.Tensor:
    x = logits.float()
    if kind == "softmax":
        return x.softmax(dim=-1)
    if kind == "sigmoid":
        return x.sigmoid()
    if kind == "sqrtsoftplus":
        return F.softplus(x).sqrt()
    raise ValueError(f"unknown scoring {kind!r}")


def select_grouped(choice: torch.Tensor, k: int, groups: int, topk_groups: int, biased: bool) -> torch.Tensor:
    """DeepSeek's grouped top-k: keep the best `topk_groups` groups, then top-k inside them.

    A group's score is the sum of its two best choice scores when a correction bias is used
    (V3), else its best score (V2).
    """
    tokens, experts = choice.shape
    g = choice.view(tokens, groups, experts // groups)
    if biased:
        group_scores = g.topk(min(2, experts // groups), dim=-1).values.sum(dim=-1)
    else:
        group_scores = g.amax(dim=-1)
    keep = group_scores.topk(topk_groups, dim=-1, sorted=False).indices
    mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
    masked = g.masked_fill(~mask.unsqueeze(-1), float("-inf")).view(tokens, experts)
    return masked.topk(k, dim=-1, sorted=False).indices


def finish_weights(scores: torch.Tensor, ids: torch.Tensor, renormalize: bool, scale: Optional[float]) -> torch.Tensor:
    w = scores.gather(1, ids)
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True).clamp_min(1e-20)
    if scale is not None and scale != 1.0:
        w = w * scale
    return w


class TorchRouter:
    """Router part of the layer; `forced` ([T, k] ids on the device) overrides its selection."""

    def __init__(self, spec: Router, top_k: int, weights: RouterWeights, forced: Optional[torch.Tensor] = None):
        self.spec, self.top_k, self.w, self.forced = spec, top_k, weights, forced
        gate_dtype = spec.gate.dtype
        logits = spec.gate.logits or gate_dtype
        self.mm_out_dtype = gate_dtype == "bf16" and logits == "fp32"   # bf16 GEMM, fp32 output
        self.logits_bf16_from_fp32 = gate_dtype == "fp32" and logits == "bf16"

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.w.gate
        if self.mm_out_dtype:
            return torch.mm(x, gate.t(), out_dtype=torch.float32)
        out = F.linear(x if gate.dtype == x.dtype else x.to(gate.dtype), gate)
        return out.to(torch.bfloat16) if self.logits_bf16_from_fp32 else out

    def select(self, scores: torch.Tensor) -> torch.Tensor:
        sel = self.spec.select
        if isinstance(sel, HashSelect):
            assert self.w.hash_table is not None and self.w.token_ids is not None
            return self.w.hash_table.index_select(0, self.w.token_ids)
        bias = self.w.correction_bias
        choice = scores if bias is None else scores + bias
        if isinstance(sel, GroupedTopK):
            return select_grouped(choice, self.top_k, sel.groups, sel.topk_groups, bias is not None)
        return choice.topk(self.top_k, dim=-1, sorted=False).indices

    def __call__(self, x: torch.Tensor) -> RouterOutput:
        logits = self.logits(x)
        scores = score(logits, self.spec.scoring)
        ids = self.select(scores)
        if self.forced is not None:   # the router ran; the forced distribution replaces its choice
            ids = self.forced
        w = finish_weights(scores, ids, bool(self.spec.renormalize), self.spec.scale)
        return RouterOutput(ids=ids, weights=w, logits=logits)
