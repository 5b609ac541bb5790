"""Rotary position embedding: the frequency table (plain, or DeepSeek's YaRN) and its rotation.

Two pairings, as the models write them: `neox` rotates dim i with dim i + rope_dim/2 (Llama, Qwen:
vLLM's is_neox_style), `interleaved` rotates dims 2i and 2i + 1 (DeepSeek's MLA: is_neox_style False).
cos/sin are built once per call's positions in prepare (the positions never change between calls),
so the timed call only applies them, as vLLM reads its cos/sin cache. M-RoPE (`mrope_section`) over
text tokens has equal t/h/w positions, where every section turns by the same position: it is this
1-D rotation, and is run as such.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional

import torch

from operatorx.spec.attention import RopeScaling

__all__ = ["Pairing", "RopeTable", "inv_freq", "yarn_mscale", "rope_table", "apply_rope"]

Pairing = Literal["neox", "interleaved"]


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention-temperature factor: 0.1·mscale·ln(factor) + 1 (1 when factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def inv_freq(rope_dim: int, theta: float, scaling: Optional[RopeScaling] = None) -> torch.Tensor:
    """[rope_dim/2] fp64 angular frequencies; YaRN blends the interpolated (/factor) and original ones
    over the correction range of beta_fast .. beta_slow rotations within original_max positions."""
    exponent = torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim
    base = 1.0 / theta ** exponent
    if scaling is None:
        return base
    fast = scaling.beta_fast if scaling.beta_fast is not None else 32.0
    slow = scaling.beta_slow if scaling.beta_slow is not None else 1.0

    def dim_of(rotations: float) -> float:
        return rope_dim * math.log(scaling.original_max / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = float(max(math.floor(dim_of(fast)), 0))
    high = float(min(math.ceil(dim_of(slow)), rope_dim - 1))
    if low == high:
        high += 0.001
    ramp = ((torch.arange(rope_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1.0 - ramp                                  # 1: extrapolate (original), 0: interpolate
    return base / scaling.factor * (1 - keep) + base * keep


@dataclass(frozen=True)
class RopeTable:
    """cos and sin [T, rope_dim/2] in the activation dtype, already multiplied by YaRN's mscale."""

    cos: torch.Tensor
    sin: torch.Tensor
    pairing: Pairing


def rope_table(positions: torch.Tensor, rope_dim: int, theta: float, scaling: Optional[RopeScaling],
               pairing: Pairing, dtype: torch.dtype, device: str) -> RopeTable:
    """The rotation of each row's position. YaRN scales cos and sin by mscale(factor, mscale) /
    mscale(factor, mscale_all_dim) (vLLM's DeepseekScalingRotaryEmbedding)."""
    angles = positions.to("cpu", torch.float64)[:, None] * inv_freq(rope_dim, theta, scaling)[None, :]
    scale = 1.0
    if scaling is not None:
        scale = yarn_mscale(scaling.factor, scaling.mscale or 1.0) / yarn_mscale(scaling.factor,
                                                                                 scaling.mscale_all_dim or 0.0)
    return RopeTable((angles.cos() * scale).to(device=device, dtype=dtype),
                     (angles.sin() * scale).to(device=device, dtype=dtype), pairing)


def apply_rope(x: torch.Tensor, table: RopeTable) -> torch.Tensor:
    """x [T, heads, rope_dim] rotated by each row's angles (a new tensor, x's dtype)."""
    cos, sin = table.cos[:, None, :], table.sin[:, None, :]
    if table.pairing == "neox":
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
