"""Routed experts: permute tokens by expert → grouped GEMM → activation → grouped GEMM → un-permute
and weighted combine, through torch's own grouped kernels.

- bf16: `torch.nn.functional.grouped_mm` (`torch._grouped_mm` where the public name is missing).
- e4m3 per-token × per-channel: `torch.nn.functional.scaled_grouped_mm` with row-wise scales
  (`torch._scaled_grouped_mm` on older torch), activations quantized per token inside the call.

Weights are stored as checkpoints hold them ([E, 2I, W] and [E, W, I]) and handed to the kernels
transposed ([E, K, N] views, column-major), the layout torch's tests use. Group boundaries come
from a sort and a searchsorted on the device: nothing in the call waits on the host.
Zero experts (ids ≥ E) sort behind the last group; the grouped GEMMs never read those rows and
the combine takes the expert input itself for them. An expert-parallel share (`experts.local` = L of
E) holds experts 0..L-1: pairs routed to the others sort behind the same way and add nothing (they
are other ranks' work).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from operatorx.backends.torch.moe.activation import apply_activation
from operatorx.backends.torch.quant import quantize
from operatorx.spec.moe import Activation
from operatorx.spec.operand import Scale

__all__ = ["ExpertWeights", "Permutation", "GroupedExperts", "permute", "grouped_mm_fn", "scaled_grouped_mm_fn"]


def grouped_mm_fn() -> tuple[Optional[Callable[..., torch.Tensor]], str]:
    fn = getattr(F, "grouped_mm", None)
    if fn is not None:
        return fn, "torch.nn.functional.grouped_mm"
    fn = getattr(torch, "_grouped_mm", None)
    return fn, "torch._grouped_mm" if fn is not None else ""


def scaled_grouped_mm_fn() -> tuple[Optional[Callable[..., torch.Tensor]], str]:
    """(a, b_t, scale_a [M], scale_b [E, N], offs) → bf16, row-wise scales on both operands."""
    public = getattr(F, "scaled_grouped_mm", None)
    if public is not None and hasattr(F, "ScalingType"):
        row = F.ScalingType.RowWise

        def call(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
                 offs: torch.Tensor) -> torch.Tensor:
            return public(a, b, sa, row, sb, row, offs=offs, output_dtype=torch.bfloat16)
        return call, "torch.nn.functional.scaled_grouped_mm (RowWise × RowWise)"
    private = getattr(torch, "_scaled_grouped_mm", None)
    if private is None:
        return None, ""

    def call_private(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
                     offs: torch.Tensor) -> torch.Tensor:
        return private(a, b, sa, sb, offs=offs, out_dtype=torch.bfloat16)
    return call_private, "torch._scaled_grouped_mm (row-wise)"


@dataclass
class ExpertWeights:
    w1: torch.Tensor                       # [E, rows1, W] bf16 or e4m3
    w2: torch.Tensor                       # [E, W, I]
    s1: Optional[torch.Tensor] = None      # [E, rows1] fp32 per-channel scales (e4m3 only)
    s2: Optional[torch.Tensor] = None      # [E, W]
    b1: Optional[torch.Tensor] = None      # [E, rows1] bf16 expert biases
    b2: Optional[torch.Tensor] = None      # [E, W]

    @property
    def num(self) -> int:
        return self.w1.shape[0]


class Permutation(NamedTuple):
    order: torch.Tensor          # [T*k] flat assignment index of each sorted row
    token: torch.Tensor          # [T*k] token of each sorted row
    expert: torch.Tensor         # [T*k] expert of each sorted row, clamped to E-1 (zero-expert rows unused)
    offs: torch.Tensor           # [E] int32 cumulative group ends (the grouped GEMMs' `offs`)


def permute(ids: torch.Tensor, num_experts: int) -> Permutation:
    flat = ids.reshape(-1)
    expert_sorted, order = flat.sort(stable=True)
    bounds = torch.arange(1, num_experts + 1, device=ids.device, dtype=expert_sorted.dtype)
    offs = torch.searchsorted(expert_sorted, bounds, out_int32=True)
    token = torch.div(order, ids.shape[1], rounding_mode="floor")
    return Permutation(order, token, expert_sorted.clamp(max=num_experts - 1), offs)


class GroupedExperts:
    """The Experts part: (x [T, W], ids, weights) → combined fp32 [T, W]."""

    def __init__(self, weights: ExpertWeights, activation: Activation, weight_on_input: bool,
                 has_zero: bool, fp8_scales: Optional[tuple[Scale, Scale]] = None,
                 stage: Callable[[str], AbstractContextManager[object]] = lambda name: nullcontext(),
                 remote: bool = False):
        self.w, self.act, self.weight_on_input, self.has_zero = weights, activation, weight_on_input, has_zero
        self.remote = remote
        """Ids at or past `w.num` are experts other ranks hold (an expert-parallel share): they add nothing."""
        self.fp8 = fp8_scales is not None
        self.a1_scale: Optional[Scale]
        self.a2_scale: Optional[Scale]
        self.a1_scale, self.a2_scale = fp8_scales if fp8_scales is not None else (None, None)
        self.stage = stage
        self.w1_t = weights.w1.transpose(1, 2)      # [E, W, rows1], column-major
        self.w2_t = weights.w2.transpose(1, 2)      # [E, I, W]
        if self.fp8:
            mm, self.kernel = scaled_grouped_mm_fn()
        else:
            mm, self.kernel = grouped_mm_fn()
        if mm is None:
            raise RuntimeError("this torch has no grouped GEMM (grouped_mm / _grouped_mm): not available")
        self._mm: Callable[..., torch.Tensor] = mm

    def _gemm(self, a: Optional[torch.Tensor], w_t: torch.Tensor, scales: Optional[torch.Tensor],
              a_scale: Optional[Scale], offs: torch.Tensor, pre: Optional[tuple[torch.Tensor, torch.Tensor]] = None
              ) -> torch.Tensor:
        """`a` may be None only where `pre` (the already quantized rows and their scales) is given."""
        if not self.fp8:
            return self._mm(a, w_t, offs=offs)
        assert a_scale is not None and scales is not None
        if pre is not None:
            aq, sa = pre
        else:
            assert a is not None
            aq, sa = quantize(a, "e4m3", a_scale, weight=False)
        return self._mm(aq, w_t, sa.reshape(-1), scales, offs)

    def __call__(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        tokens, k = ids.shape
        with self.stage("moe/permute"):
            p = permute(ids, self.w.num)
            pre = None
            xs: Optional[torch.Tensor]
            if self.weight_on_input:
                w_sorted = weights.reshape(-1).index_select(0, p.order)
                xs = x.index_select(0, p.token) * w_sorted.to(x.dtype).unsqueeze(1)
            elif self.fp8:    # quantize the T tokens once, then move the fp8 rows (quantize-then-dispatch)
                assert self.a1_scale is not None     # fp8 ⇔ fp8_scales given
                xq, sx = quantize(x, "e4m3", self.a1_scale, weight=False)
                xs = None
                rows = xq.view(torch.uint8).index_select(0, p.token).view(xq.dtype)  # a byte gather
                pre = (rows, sx.index_select(0, p.token))
            else:
                xs = x.index_select(0, p.token)
        with self.stage("moe/expert_gemm1"):
            h = self._gemm(xs, self.w1_t, self.w.s1, self.a1_scale, p.offs, pre)
            if self.w.b1 is not None:
                h = h + self.w.b1.index_select(0, p.expert)
        with self.stage("moe/activation"):
            a = apply_activation(h, self.act)
        with self.stage("moe/expert_gemm2"):
            y = self._gemm(a, self.w2_t, self.w.s2, self.a2_scale, p.offs)
            if self.w.b2 is not None:
                y = y + self.w.b2.index_select(0, p.expert)
        with self.stage("moe/combine"):
            per_assignment = y.new_empty((tokens * k, y.shape[1])).index_copy_(0, p.order, y).view(tokens, k, -1)
            if self.has_zero:   # a zero expert hands its input back unchanged
                x_in = x if not self.weight_on_input else None
                zero = (ids >= self.w.num).unsqueeze(-1)
                if x_in is None:
                    x_in_assign = (x.unsqueeze(1) * weights.to(x.dtype).unsqueeze(-1))
                else:
                    x_in_assign = x_in.unsqueeze(1).expand(tokens, k, x.shape[1])
                per_assignment = torch.where(zero, x_in_assign, per_assignment)
            if self.remote:     # pairs of experts other ranks hold: their rows were never computed
                per_assignment = per_assignment.masked_fill((ids >= self.w.num).unsqueeze(-1), 0)
            if self.weight_on_input:
                return per_assignment.float().sum(dim=1)
            return torch.bmm(weights.unsqueeze(1), per_assignment.float()).squeeze(1)

