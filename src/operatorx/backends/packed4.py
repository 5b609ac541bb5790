"""4-bit weights as checkpoints store them: MXFP4 (e2m1 + ue8m0 scale per 32) and INT4 (group 32).

Two weight-only formats that vLLM runs on sm90 through Marlin, and that the vllm backend must
load to time `moe_small`'s MXFP4 and INT4 W4A16 layers instead of refusing them (issue 14):
- MXFP4 (OCP microscaling): each value an e2m1 code (sign, 2 exponent bits, 1 mantissa bit:
  magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6), two codes per byte with the even element in the low
  nibble, and one ue8m0 scale (a bare exponent, 2^(e - 127)) per 32 consecutive values along K.
  Layout [N, K/2] uint8 + [N, K/32] uint8, as gpt-oss and vLLM's MXFP4 MoE parameters hold it.
- INT4, compressed-tensors `pack-quantized`, symmetric: each value an integer in [-8, 7] stored as
  value + 8, eight per int32 along K with element j in bits 4j..4j+3, and one scale per group of
  32 along K. Layout `weight_packed` [N, K/8] int32 + `weight_scale` [N, K/32] (bf16 in
  checkpoints) + `weight_shape` (N, K).

This module is the formats only (quantize, pack, unpack, dequantize), device-agnostic and exact;
it builds synthetic checkpoints and the fp32 reference the check compares against. Synthetic
scales are powers of two, so the bf16 and ue8m0 scale tensors hold them exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["E2M1_MAGNITUDES", "MXFP4_GROUP", "INT4_GROUP", "MxFp4", "Int4Packed", "quantize_mxfp4",
           "dequantize_mxfp4", "quantize_int4", "dequantize_int4"]

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""The value of e2m1 codes 0-7; code | 8 is the same magnitude, negative."""
MXFP4_GROUP = 32
INT4_GROUP = 32
_E2M1_MAX = 6.0
_UE8M0_BIAS = 127


@dataclass(frozen=True)
class MxFp4:
    packed: torch.Tensor
    """[N, K/2] uint8: two e2m1 codes a byte, the even element in the low nibble."""
    scales: torch.Tensor
    """[N, K/32] uint8 ue8m0: the block's scale is 2^(value - 127)."""


@dataclass(frozen=True)
class Int4Packed:
    packed: torch.Tensor
    """[N, K/8] int32: value + 8 in bits 4j..4j+3 for element j of each eight."""
    scales: torch.Tensor
    """[N, K/32] fp32 (a checkpoint stores them in bf16: powers of two, exact there)."""

    @property
    def shape(self) -> tuple[int, int]:
        return self.packed.shape[0], self.packed.shape[1] * 8


def _groups(w: torch.Tensor, group: int) -> torch.Tensor:
    n, k = w.shape
    if k % group:
        raise ValueError(f"K={k} is not a multiple of the {group}-value scale group")
    return w.float().reshape(n, k // group, group)


def _pow2_scale(amax: torch.Tensor, top: float) -> torch.Tensor:
    """The smallest power of two s with amax / s <= top (1 for an all-zero group)."""
    ratio = torch.where(amax > 0, amax / top, torch.ones_like(amax))
    return torch.exp2(torch.ceil(torch.log2(ratio)))


def quantize_mxfp4(w: torch.Tensor) -> MxFp4:
    """`w` [N, K] → MXFP4, each value rounded to the nearest e2m1 magnitude of its block (ties to the
    even code), with a power-of-two block scale that keeps the block's largest value within 6."""
    n, k = w.shape
    g = _groups(w, MXFP4_GROUP)
    scale = _pow2_scale(g.abs().amax(dim=-1, keepdim=True), _E2M1_MAX)
    x = (g / scale).clamp(-_E2M1_MAX, _E2M1_MAX)
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=w.device)
    dist = (x.abs().unsqueeze(-1) - mags).abs()                   # [..., 8]
    nearest = dist == dist.min(dim=-1, keepdim=True).values
    even = (torch.arange(8, device=w.device) % 2 == 0).float()    # mantissa bit 0: the even code
    code = (nearest.float() * 2 + even).argmax(dim=-1)            # the nearest; on a tie, the even one
    code = code + 8 * (x < 0).long()
    code = code.reshape(n, k).to(torch.uint8)
    packed = code[:, 0::2] | (code[:, 1::2] << 4)
    exponent = torch.log2(scale).reshape(n, k // MXFP4_GROUP).round().long() + _UE8M0_BIAS
    if bool((exponent < 0).any() or (exponent > 254).any()):
        raise ValueError("a block scale is outside ue8m0's range")
    return MxFp4(packed.contiguous(), exponent.to(torch.uint8).contiguous())


def dequantize_mxfp4(m: MxFp4) -> torch.Tensor:
    """fp32 [N, K] of what the MXFP4 tensors mean."""
    n, half = m.packed.shape
    lo, hi = m.packed & 0x0F, m.packed >> 4
    codes = torch.stack([lo, hi], dim=-1).reshape(n, half * 2).long()
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=m.packed.device)
    values = mags[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
    scale = torch.exp2(m.scales.float() - _UE8M0_BIAS)
    return (values.reshape(n, -1, MXFP4_GROUP) * scale.unsqueeze(-1)).reshape(n, half * 2)


def quantize_int4(w: torch.Tensor) -> Int4Packed:
    """`w` [N, K] → symmetric INT4 with a power-of-two scale per 32 (the group's largest value
    within 7 of it), packed as compressed-tensors' `pack-quantized` stores it."""
    n, k = w.shape
    g = _groups(w, INT4_GROUP)
    scale = _pow2_scale(g.abs().amax(dim=-1, keepdim=True), 7.0)
    q = torch.round(g / scale).clamp(-8, 7).to(torch.int32).reshape(n, k)
    nibbles = (q + 8).reshape(n, k // 8, 8)
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=w.device)
    packed = torch.zeros(n, k // 8, dtype=torch.int64, device=w.device)
    for j in range(8):              # int64 first: element 7's top bit would overflow an int32 shift
        packed |= nibbles[..., j].long() << int(shifts[j])
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return Int4Packed(packed.contiguous(), scale.reshape(n, k // INT4_GROUP).contiguous())


def dequantize_int4(p: Int4Packed) -> torch.Tensor:
    """fp32 [N, K] of what the packed INT4 tensors mean."""
    n, k = p.shape
    words = p.packed.long() & 0xFFFFFFFF
    nibbles = torch.stack([(words >> (4 * j)) & 0xF for j in range(8)], dim=-1).reshape(n, k)
    q = nibbles.float() - 8
    return (q.reshape(n, -1, INT4_GROUP) * p.scales.float().unsqueeze(-1)).reshape(n, k)
