"""fp32 references for the vllm backend's checks, in plain torch.

vLLM quantizes activations inside the layer, so the reference does too, with the same groups:
per 1x128 group (block scheme), per token, or with the static per-tensor scale. The scale's
flavor is the one thing vLLM decides at run time (DeepGEMM's UE8M0 default rounds 1x128 scales
up to powers of two), so a check tries each flavor vLLM could have used and reports the one that
matches: that names the activation scales the timed kernel really used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch

from operatorx.backends.torch.quant import FP8_MAX, dequantize, quantize
from operatorx.spec.operand import Scale

__all__ = ["ACT_FLAVORS", "act_quant_dequant", "rel_error", "best_flavor", "route_weights"]

#: Activation quantization flavors a scheme may run with in vLLM (first = the default on sm90).
ACT_FLAVORS: dict[str, tuple[str, ...]] = {
    "bf16": ("none",),
    "fp8_block": ("ue8m0", "fp32"),
    "fp8_token_channel": ("fp32",),
    "fp8_token_tensor": ("fp32",),
    "fp8_tensor_static": ("static",),
    "mxfp4_w4a16": ("none",),
    "int4_w4a16": ("none",),
}


def act_quant_dequant(x: torch.Tensor, scheme: str, flavor: str,
                      static_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [rows, K] → fp32 values after vLLM's activation quantization (identity for bf16)."""
    if scheme == "bf16" or flavor == "none":
        return x.float()
    if flavor == "static":
        assert static_scale is not None
        s = static_scale.float().reshape(1, 1)
        q = (x.float() / s).clamp_(-FP8_MAX["e4m3"], FP8_MAX["e4m3"]).to(torch.float8_e4m3fn)
        return q.float() * s
    group = [1, 128] if scheme == "fp8_block" else [1, -1]
    scale = Scale(dtype="ue8m0" if flavor == "ue8m0" else "fp32", static=False, group=group)
    q, s = quantize(x, "e4m3", scale, weight=False)
    return dequantize(q, s, scale.block(x.shape[0], x.shape[1], weight=False))


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def best_flavor(out: torch.Tensor, scheme: str, reference: Callable[[str], torch.Tensor],
                flavors: Optional[tuple[str, ...]] = None) -> tuple[float, str]:
    """(smallest relative error, its flavor) over the flavors the scheme can run with (or `flavors`)."""
    tried = flavors or ACT_FLAVORS[scheme]
    best = (float("inf"), tried[0])
    for flavor in tried:
        err = rel_error(out, reference(flavor))
        if not err >= best[0]:      # NaN never wins over a number, and the first NaN is kept
            best = (err, flavor)
    return best


def route_weights(logits: torch.Tensor, ids: torch.Tensor, scoring: str, renormalize: bool,
                  scale: Optional[float]) -> torch.Tensor:
    """The router's weights for chosen `ids` from the logits (correction bias never enters them).
    sqrtsoftplus is DeepSeek-V4's score, sqrt(softplus(logit)) (vLLM 0.26 topk_hash_softplus_sqrt)."""
    x = logits.float()
    if scoring == "softmax":
        scores = x.softmax(dim=-1)
    elif scoring == "sigmoid":
        scores = x.sigmoid()
    elif scoring == "sqrtsoftplus":
        scores = torch.nn.functional.softplus(x).sqrt()
    else:
        raise ValueError(f"no reference for router scoring {scoring!r}")
    w = scores.gather(1, ids.long())
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True).clamp_min(1e-20)
    if scale is not None and scale != 1.0:
        w = w * scale
    return w
