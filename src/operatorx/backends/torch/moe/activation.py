"""Expert activations: the gated (gate, up) pair or a plain activation, in the dtype of `h`.

Gated layouts: `interleaved` puts gate and up in alternating columns (gpt-oss); otherwise the
first half of the w1 rows is the gate and the second half up (vLLM's SiluAndMul order).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from operatorx.spec.moe import Activation

__all__ = ["activation_refusal", "apply_activation", "split_gated", "SWIGLUOAI_DEFAULTS"]

#: gpt-oss's constants, used when the case leaves them out.
SWIGLUOAI_DEFAULTS = {"alpha": 1.702, "beta": 1.0, "limit": 7.0}
_DEFINED = ("silu", "gelu", "gelu_tanh", "swigluoai")


def activation_refusal(act: Activation) -> Optional[str]:
    if act.kind not in _DEFINED:
        return (f"activation {act.kind!r}: docs/case-format.md does not define it yet, so no backend computes it "
                f"(this one runs {', '.join(_DEFINED)})")
    if act.kind == "swigluoai" and not act.is_gated:
        return "activation swigluoai is gated by definition; the case says gated: false"
    if not act.is_gated and (act.limit is not None or act.interleaved):
        return "limit/interleaved apply to gated activations only"
    return None


def split_gated(h: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if interleaved:
        return h[..., 0::2], h[..., 1::2]
    half = h.shape[-1] // 2
    return h[..., :half], h[..., half:]


def _plain(x: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "silu":
        return F.silu(x)
    if kind == "gelu":
        return F.gelu(x)
    if kind == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    raise ValueError(f"no plain form of {kind}")


def apply_activation(h: torch.Tensor, act: Activation) -> torch.Tensor:
    """[rows, 2I] (gated) or [rows, I] → [rows, I]. Works for bf16 (the op) and fp32 (the reference)."""
    if not act.is_gated:
        return _plain(h, act.kind)
    gate, up = split_gated(h, bool(act.interleaved))
    if act.kind == "swigluoai":
        alpha = act.alpha if act.alpha is not None else SWIGLUOAI_DEFAULTS["alpha"]
        beta = act.beta if act.beta is not None else SWIGLUOAI_DEFAULTS["beta"]
        limit = act.limit if act.limit is not None else SWIGLUOAI_DEFAULTS["limit"]
        gate = gate.clamp(max=limit)
        up = up.clamp(-limit, limit)
        return (up + beta) * (gate * torch.sigmoid(gate * alpha))
    if act.limit is not None:  # clamped SwiGLU (DeepSeek-V4's swiglu_limit)
        gate = gate.clamp(max=act.limit)
        up = up.clamp(-act.limit, act.limit)
    return _plain(gate, act.kind) * up
