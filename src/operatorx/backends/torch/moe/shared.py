"""Shared experts: one dense gated MLP of width count × inter on every token, optionally scaled
by a sigmoid gate (Qwen2-MoE / Qwen3.5), added to the routed output.

`count` shared experts of width `inter` are one MLP of width count·inter (the checkpoint's fused
layout). bf16 runs F.linear; e4m3 per-token × per-channel runs F.scaled_mm (RowWise), quantizing
the activations per token inside the call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from operatorx.backends.torch.moe.activation import apply_activation
from operatorx.backends.torch.quant import quantize
from operatorx.spec.moe import Activation
from operatorx.spec.operand import Scale

__all__ = ["SharedWeights", "SharedExperts"]


@dataclass
class SharedWeights:
    w1: torch.Tensor                      # [rows1, H] bf16 or e4m3
    w2: torch.Tensor                      # [H, C·Is]
    gate: Optional[torch.Tensor] = None   # [1, H] bf16: the sigmoid gate's weight
    s1: Optional[torch.Tensor] = None     # [rows1] fp32 per-channel scales (e4m3)
    s2: Optional[torch.Tensor] = None     # [H]


class SharedExperts:
    def __init__(self, weights: SharedWeights, activation: Activation,
                 fp8_scales: Optional[tuple[Scale, Scale]] = None):
        self.w, self.act = weights, activation
        self.fp8_scales = fp8_scales
        self.kernel = ("torch.nn.functional.scaled_mm (RowWise × RowWise)" if fp8_scales
                       else "torch.nn.functional.linear")
        if fp8_scales is not None:
            assert weights.s1 is not None and weights.s2 is not None
            self.w1_t, self.w2_t = weights.w1.t(), weights.w2.t()
            self.s1, self.s2 = weights.s1.reshape(1, -1), weights.s2.reshape(1, -1)

    def _linear(self, x: torch.Tensor, which: int) -> torch.Tensor:
        if self.fp8_scales is None:
            return F.linear(x, self.w.w1 if which == 1 else self.w.w2)
        row = F.ScalingType.RowWise
        xq, sx = quantize(x, "e4m3", self.fp8_scales[which - 1], weight=False)
        w_t, sw = (self.w1_t, self.s1) if which == 1 else (self.w2_t, self.s2)
        return F.scaled_mm(xq, w_t, sx.reshape(-1, 1), row, sw, row, output_dtype=torch.bfloat16)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self._linear(apply_activation(self._linear(x, 1), self.act), 2)
        if self.w.gate is not None:
            y = y * torch.sigmoid(F.linear(x, self.w.gate))
        return y
