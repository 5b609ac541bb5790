"""fp8 GEMM through torch.nn.functional.scaled_mm: which recipe a case maps to, and the scale layouts.

torch (cuBLASLt on sm90) knows these fp8 recipes: tensorwise × tensorwise, rowwise × rowwise,
1x128 × 128x128 (DeepSeek), 1x128 × 1x128. Anything else has no torch kernel and is refused
with that list, never run another way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from operatorx.spec import GemmArgs

__all__ = ["Recipe", "recipe_for", "scale_a_layout", "scale_b_layout"]


@dataclass(frozen=True)
class Recipe:
    name: str                    # "tensorwise", "rowwise", "block_1x128_128x128", "block_1x128_1x128"
    a: str                       # ScalingType member names
    b: str

    def scaling_types(self) -> tuple[F.ScalingType, F.ScalingType]:
        return getattr(F.ScalingType, self.a), getattr(F.ScalingType, self.b)


_RECIPES: dict[tuple[tuple[int, int], tuple[int, int]], Recipe] = {
    ((-1, -1), (-1, -1)): Recipe("tensorwise", "TensorWise", "TensorWise"),
    ((1, -1), (1, -1)): Recipe("rowwise", "RowWise", "RowWise"),
    ((1, 128), (128, 128)): Recipe("block_1x128_128x128", "BlockWise1x128", "BlockWise128x128"),
    ((1, 128), (1, 128)): Recipe("block_1x128_1x128", "BlockWise1x128", "BlockWise1x128"),
}
KNOWN = "tensorwise×tensorwise, per-token×per-channel, 1x128×128x128, 1x128×1x128"


def recipe_for(args: GemmArgs) -> tuple[Optional[Recipe], str]:
    """The torch recipe for the case's scale layouts, or (None, why not)."""
    a, b = args.a.scale, args.b.scale
    if a is None or b is None:
        return None, "both fp8 operands need scales"
    key = (a.oriented(weight=False), b.oriented(weight=True))
    recipe = _RECIPES.get(key)
    if recipe is None:
        return None, (f"torch scaled_mm has no recipe for a groups {list(a.group)} × b groups {list(b.group)} "
                      f"(it has {KNOWN})")
    return recipe, ""


def _outer_major(s: torch.Tensor) -> torch.Tensor:
    """A copy of a 2-D tensor with strides (1, rows), as cuBLASLt reads block scales.

    Built with empty_strided: `.t().contiguous().t()` leaves strides alone when a dimension
    is 1 (M=1 decode), and torch then refuses the layout.
    """
    out = torch.empty_strided(s.shape, (1, s.shape[0]), dtype=s.dtype, device=s.device)
    return out.copy_(s)


def scale_a_layout(recipe: Recipe, s: torch.Tensor) -> torch.Tensor:
    """The activation's scales [M or 1, K blocks or 1] in the layout cuBLASLt reads."""
    if recipe.name == "tensorwise":
        return s.reshape(())
    if recipe.name == "rowwise":
        return s.reshape(-1, 1)
    return _outer_major(s)                   # [M, K/128], strides (1, M)


def scale_b_layout(recipe: Recipe, s: torch.Tensor) -> torch.Tensor:
    """The weight's scales (checkpoint layout [N blocks, K blocks]) for mat_b = weight.t()."""
    if recipe.name == "tensorwise":
        return s.reshape(())
    if recipe.name == "rowwise":
        return s.reshape(1, -1)
    if recipe.name == "block_1x128_1x128":
        return _outer_major(s)               # [N, K/128], strides (1, N)
    k_blocks = s.shape[1]
    padded = F.pad(s, (0, -k_blocks % 4))    # cuBLASLt wants K blocks rounded up to 4
    return padded.t()                        # [round4(K/128), N/128], strides (1, round4(K/128))
