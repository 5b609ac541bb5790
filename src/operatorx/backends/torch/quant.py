"""Scaled quantization in plain torch ops, for operands described by the spec.

Used twice: on weights at prepare time (untimed), and on activations inside the timed call
when the case says the activation arrives unquantized. Scales are fp32; ue8m0 scales are
fp32 powers of two, which give the same arithmetic as an 8-bit exponent.
"""

from __future__ import annotations

import torch

from operatorx.spec.operand import Scale

__all__ = ["TORCH_DTYPES", "FP8_MAX", "torch_dtype", "quantize", "dequantize", "expand_scale"]

TORCH_DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
    "e4m3": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
}
FP8_MAX: dict[str, float] = {"e4m3": 448.0, "e5m2": 57344.0}
_TINY = 1e-12


def torch_dtype(name: str) -> torch.dtype:
    try:
        return TORCH_DTYPES[name]
    except KeyError:
        raise ValueError(f"{name} has no torch dtype here") from None


def quantize(x: torch.Tensor, dtype: str, scale: Scale, weight: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a 2-D [rows, cols] tensor; returns (q [rows, cols], scales [row blocks, col blocks]).

    Partial row blocks (a weight whose N is not a multiple of the block) are padded with
    zeros for the amax only.
    """
    rows, cols = x.shape
    r, c = scale.block(rows, cols, weight)
    pad_rows = -rows % r
    xf = x.float()
    if pad_rows:
        xf = torch.nn.functional.pad(xf, (0, 0, 0, pad_rows))
    blocks = xf.reshape((rows + pad_rows) // r, r, cols // c, c)
    amax = blocks.abs().amax(dim=(1, 3))
    s = (amax / FP8_MAX[dtype]).clamp_(min=_TINY)
    if scale.dtype == "ue8m0":
        s = torch.exp2(torch.ceil(torch.log2(s)))
    q = (blocks / s[:, None, :, None]).clamp_(-FP8_MAX[dtype], FP8_MAX[dtype])
    q = q.reshape(rows + pad_rows, cols)[:rows].to(torch_dtype(dtype))
    return q, s


def expand_scale(s: torch.Tensor, block: tuple[int, int], rows: int, cols: int) -> torch.Tensor:
    """Scales [row blocks, col blocks] of `block`-sized groups broadcast back to [rows, cols]."""
    r, c = block
    return s.repeat_interleave(r, dim=0)[:rows].repeat_interleave(c, dim=1)[:, :cols]


def dequantize(q: torch.Tensor, s: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    rows, cols = q.shape
    return q.float() * expand_scale(s, block, rows, cols)
