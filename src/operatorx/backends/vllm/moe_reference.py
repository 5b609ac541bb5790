"""fp32 reference of one MoE block for the rows checked, given the routing vLLM actually used.

Expert weights are dequantized from the checkpoint copies; activations go through the same
quantization vLLM applies (per flavor, see reference.py); the first GEMM's output and the
activation are rounded to bf16 as vLLM's fused kernels store them.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F

from operatorx.backends.vllm.reference import ACT_FLAVORS, act_quant_dequant

__all__ = ["moe_reference"]


def _act(h: torch.Tensor, kind: str) -> torch.Tensor:
    half = h.shape[-1] // 2
    gate, up = h[..., :half], h[..., half:]
    return (F.silu(gate) if kind == "silu" else F.gelu(gate)) * up


def _mlp(x_q: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, scheme: str, flavor: str, act: str) -> torch.Tensor:
    h = (x_q @ w1.T).to(torch.bfloat16).float()
    a = _act(h, act).to(torch.bfloat16)
    return act_quant_dequant(a, scheme, flavor) @ w2.T


def moe_reference(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, ref: dict[str, Any],
                  scheme: str, act: str) -> dict[str, torch.Tensor]:
    """flavor → fp32 [rows, H] output (routed, weighted, plus the shared expert)."""
    flavors = ACT_FLAVORS[scheme]
    rows = x.shape[0]
    xq = {f: act_quant_dequant(x, scheme, f) for f in flavors}
    out = {f: torch.zeros(rows, x.shape[1], device=x.device, dtype=torch.float32) for f in flavors}
    ids, w = ids[:rows].long(), weights[:rows].float()
    for expert in torch.unique(ids).tolist():
        tok, slot = (ids == expert).nonzero(as_tuple=True)
        q1, q2 = ref["experts"][expert]
        w1, w2 = q1.dequant(), q2.dequant()
        scale = w[tok, slot].unsqueeze(1)
        for f in flavors:
            out[f].index_add_(0, tok, _mlp(xq[f][tok], w1, w2, scheme, f, act) * scale)
        del w1, w2
    shared: Optional[tuple[Any, Any, Optional[torch.Tensor]]] = ref.get("shared")
    if shared is not None:
        q1, q2, sgate = shared
        w1, w2 = q1.dequant(), q2.dequant()
        for f in flavors:
            y = _mlp(xq[f], w1, w2, scheme, f, act)
            if sgate is not None:
                y = y * torch.sigmoid(x.float() @ sgate.float().T)
            out[f] += y
    return out
