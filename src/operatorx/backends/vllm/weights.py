"""Synthetic weights in the checkpoint's on-disk format, and loading them into vLLM parameters.

One matrix [N, K] is quantized as the scheme's checkpoint stores it (the names are vLLM 0.26's):
- fp8_block: e4m3 `weight` + fp32 (or bf16, as Qwen3.5/Qwen3-Next FP8 store them)
  `weight_scale_inv` [ceil(N/128), ceil(K/128)], the scales powers of two so vLLM's UE8M0
  requantization for DeepGEMM (the sm90 default) loses nothing and bf16 holds them exactly;
- fp8_tensor_static / fp8_token_tensor: e4m3 `weight` + fp32 `weight_scale`, one per shard
  (a merged gate/up projection carries two), plus `input_scale` [1] when static;
- fp8_token_channel: e4m3 `weight` + fp32 `weight_scale` [N] (one per output row);
- mxfp4_w4a16: packed e2m1 `weight` [N, K/2] uint8 + ue8m0 `weight_scale` [N, K/32] uint8
  (backends/packed4.py), as DeepSeek-V4's MXFP4 experts load into vLLM's `Mxfp4MoEMethod`.
- int4_w4a16: compressed-tensors `pack-quantized` INT4, `weight_packed` [N, K/8] int32 + bf16
  `weight_scale` [N, K/32] (Kimi-K2.5's experts); vLLM's Marlin method holds them transposed.
  Block FP8 scales may also be stored as ue8m0 (`float8_e8m0fnu`), as DeepSeek-V4's FP8 layers are.

`load_params` copies tensors into a module's own parameters by name, and fails naming both
sides when a parameter is missing, unexpected or shaped differently: that is where a vLLM
API change shows first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from operatorx.backends.packed4 import (
    Int4Packed,
    MxFp4,
    dequantize_int4,
    dequantize_mxfp4,
    quantize_int4,
    quantize_mxfp4,
)
from operatorx.backends.torch.quant import FP8_MAX, dequantize, quantize
from operatorx.spec.operand import Scale

__all__ = ["QuantMatrix", "quantize_matrix", "scale_name", "load_params", "param_summary", "static_input_scale"]

_BLOCK = Scale(dtype="ue8m0", static=True, group=[128, 128])
_TENSOR = Scale(dtype="fp32", static=True, group=[-1, -1])
_CHANNEL = Scale(dtype="fp32", static=True, group=[-1, 1])
_SCALE_DTYPES = {"bf16": torch.bfloat16, "ue8m0": torch.float8_e8m0fnu}


def scale_name(scheme: str) -> Optional[str]:
    if scheme == "bf16":
        return None
    return "weight_scale_inv" if scheme == "fp8_block" else "weight_scale"


@dataclass
class QuantMatrix:
    """One [N, K] weight as stored: values, scales in checkpoint layout, and how to read it back."""

    q: torch.Tensor                   # [N, K] e4m3 (bf16 for the bf16 scheme; [N, K/2] uint8 for mxfp4_w4a16)
    scale: Optional[torch.Tensor]     # block [nb, kb] / tensor [shards] / channel [N] / mx [N, K/32]; None for bf16
    scheme: str
    shards: tuple[int, ...]

    def dequant(self, rows: Optional[slice] = None) -> torch.Tensor:
        """fp32 [N, K] (or the rows asked for) as the checkpoint means it."""
        if self.scale is None:
            q = self.q if rows is None else self.q[rows]
            return q.float()
        if self.scheme == "mxfp4_w4a16":
            full = dequantize_mxfp4(MxFp4(self.q, self.scale))
            return full if rows is None else full[rows]
        if self.scheme == "int4_w4a16":
            full = dequantize_int4(Int4Packed(self.q, self.scale))
            return full if rows is None else full[rows]
        if self.scheme == "fp8_block":
            full = dequantize(self.q, self.scale.float(), (128, 128))
            return full if rows is None else full[rows]
        if self.scheme == "fp8_token_channel":
            out = self.q.float() * self.scale[:, None]
            return out if rows is None else out[rows]
        per_row = torch.repeat_interleave(self.scale, torch.tensor(self.shards, device=self.scale.device))
        out = self.q.float() * per_row[:, None]
        return out if rows is None else out[rows]


def quantize_matrix(w: torch.Tensor, scheme: str, shards: Optional[tuple[int, ...]] = None,
                    scale_dtype: str = "fp32") -> QuantMatrix:
    """`w` [N, K] bf16/fp32 → the checkpoint's stored form under `scheme` (`scale_dtype`: the dtype
    the checkpoint stores block scales in, fp32, bf16 or ue8m0)."""
    n = w.shape[0]
    shards = shards or (n,)
    assert sum(shards) == n, (shards, n)
    if scheme == "bf16":
        return QuantMatrix(w.to(torch.bfloat16), None, scheme, shards)
    if scheme == "mxfp4_w4a16":
        m = quantize_mxfp4(w)
        return QuantMatrix(m.packed, m.scales, scheme, shards)
    if scheme == "int4_w4a16":      # scales in bf16, as compressed-tensors checkpoints store them (exact)
        p = quantize_int4(w)
        return QuantMatrix(p.packed, p.scales.to(torch.bfloat16), scheme, shards)
    if scheme == "fp8_block":
        q, s = quantize(w, "e4m3", _BLOCK, weight=True)
        if scale_dtype in _SCALE_DTYPES:
            stored = s.to(_SCALE_DTYPES[scale_dtype])
            if not torch.equal(stored.float(), s.float()):   # powers of two in range are exact in both
                raise ValueError(f"a block scale is not exact in {scale_dtype}")
            s = stored
        elif scale_dtype != "fp32":
            raise ValueError(f"block scales are stored in fp32, bf16 or ue8m0 here, not {scale_dtype!r}")
        return QuantMatrix(q, s.contiguous(), scheme, shards)
    if scheme == "fp8_token_channel":
        q, s = quantize(w, "e4m3", _CHANNEL, weight=True)
        return QuantMatrix(q, s.reshape(-1).contiguous(), scheme, shards)
    if scheme in ("fp8_tensor_static", "fp8_token_tensor"):
        parts_q, parts_s = [], []
        for part in torch.split(w, list(shards), dim=0):
            q, s = quantize(part, "e4m3", _TENSOR, weight=True)
            parts_q.append(q)
            parts_s.append(s.reshape(1))
        return QuantMatrix(torch.cat(parts_q), torch.cat(parts_s).contiguous(), scheme, shards)
    raise ValueError(f"no checkpoint layout for scheme {scheme!r}")


def static_input_scale(x: torch.Tensor) -> torch.Tensor:
    """A calibrated per-tensor activation scale for `x`, as a checkpoint's `input_scale` [1]."""
    return (x.float().abs().amax() / FP8_MAX["e4m3"]).clamp_min(1e-12).reshape(1)


def _squeezed(shape: torch.Size) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def load_params(module: torch.nn.Module, tensors: dict[str, torch.Tensor], what: str) -> None:
    """Copy each tensor into the module's parameter of that name (its own, not its children's)."""
    params = dict(module.named_parameters(recurse=False))
    unexpected = sorted(set(tensors) - set(params))
    unfilled = sorted(set(params) - set(tensors))
    if unexpected or unfilled:
        have = {k: (tuple(p.shape), str(p.dtype)) for k, p in params.items()}
        raise RuntimeError(f"{what}: checkpoint tensors {unexpected or '-'} have no parameter, parameters "
                           f"{unfilled or '-'} got no tensor; the layer's parameters are {have}")
    for name, t in tensors.items():
        p = params[name]
        if tuple(p.shape) != tuple(t.shape):
            if _squeezed(p.shape) != _squeezed(t.shape):
                raise RuntimeError(f"{what}.{name}: checkpoint shape {tuple(t.shape)} ({t.dtype}) does not fit "
                                   f"the parameter's {tuple(p.shape)} ({p.dtype})")
            t = t.reshape(p.shape)
        p.data.copy_(t.to(p.device))


def param_summary(module: torch.nn.Module) -> dict[str, str]:
    """name → 'dtype[shape]' for every parameter and registered tensor attribute of interest."""
    out = {name: f"{str(p.dtype).replace('torch.', '')}{list(p.shape)}" for name, p in module.named_parameters()}
    return out
