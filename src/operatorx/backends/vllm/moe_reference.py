"""fp32 reference of one MoE block for the rows checked, given the routing vLLM actually used.

Expert weights are dequantized from the checkpoint copies; activations go through the same
quantization vLLM applies (per flavor, see reference.py); the first GEMM's output and the
activation are rounded to bf16 as vLLM's fused kernels store them.

The activation is computed from the case's descriptor with vLLM 0.26's definitions
(layers/activation.py forward_native, fused_moe/utils.py `_swiglu_limit_torch`), written out
here rather than called, so a change in vLLM's kernels shows as a failed check:
- silu / gelu / gelu_tanh: act(gate) * up, gate = first half of the w1 rows, up = second half;
- silu with `limit` L (DeepSeek-V4's swiglu_limit): gate clamped to <= L, up to [-L, L]
  (only when L > 0, as vLLM does), then silu(gate) * up;
- swigluoai (alpha a, beta b, limit L; defaults 1.702, 1, 7): gate <= L, up in [-L, L],
  gate * sigmoid(a * gate) * (up + b); gate/up alternate rows when `interleaved` (gpt-oss),
  else halves (vLLM's swigluoai_uninterleave).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F

from operatorx.backends.vllm.quant_map import SWIGLUOAI_KERNEL_DEFAULTS
from operatorx.backends.vllm.reference import ACT_FLAVORS, act_quant_dequant
from operatorx.spec.moe import Activation

__all__ = ["moe_reference", "gated_activation", "reference_flavors"]


def gated_activation(h: torch.Tensor, act: Activation) -> torch.Tensor:
    """[rows, 2I] → [rows, I] in fp32, as vLLM's fused MoE computes the case's activation."""
    h = h.float()
    if act.interleaved:
        gate, up = h[..., 0::2], h[..., 1::2]
    else:
        half = h.shape[-1] // 2
        gate, up = h[..., :half], h[..., half:]
    if act.kind == "swigluoai":
        d = SWIGLUOAI_KERNEL_DEFAULTS
        alpha = d["alpha"] if act.alpha is None else act.alpha
        beta = d["beta"] if act.beta is None else act.beta
        limit = d["limit"] if act.limit is None else act.limit
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        return gate * torch.sigmoid(alpha * gate) * (up + beta)
    if act.limit is not None and act.limit > 0:
        gate = gate.clamp(max=act.limit)
        up = up.clamp(min=-act.limit, max=act.limit)
    if act.kind == "silu":
        return F.silu(gate) * up
    if act.kind == "gelu":
        return F.gelu(gate) * up
    if act.kind == "gelu_tanh":
        return F.gelu(gate, approximate="tanh") * up
    raise ValueError(f"no reference for activation {act.kind!r}")


def _mlp(x_q: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, scheme: str, flavor: str,
         act: Activation, b1: Optional[torch.Tensor] = None, b2: Optional[torch.Tensor] = None) -> torch.Tensor:
    h = x_q @ w1.T
    if b1 is not None:          # gpt-oss: the bias joins the GEMM's fp32 accumulator, then bf16
        h = h + b1.float()
    a = gated_activation(h.to(torch.bfloat16).float(), act).to(torch.bfloat16)
    y = act_quant_dequant(a, scheme, flavor) @ w2.T
    return y if b2 is None else y + b2.float()


def reference_flavors(scheme: str, shared_scheme: Optional[str]) -> tuple[str, ...]:
    """The activation-scale flavors to try: the routed experts' when they quantize activations, else
    a quantized shared MLP's (DeepSeek-V4: weight-only MXFP4 experts beside a block-FP8 shared expert)."""
    flavors = ACT_FLAVORS[scheme]
    if flavors == ("none",) and shared_scheme is not None:
        return ACT_FLAVORS[shared_scheme]
    return flavors


def _own(flavor: str, scheme: str) -> str:
    """The flavor a part computes with: the one tried when its scheme has it, else its default."""
    return flavor if flavor in ACT_FLAVORS[scheme] else ACT_FLAVORS[scheme][0]


def moe_reference(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, ref: dict[str, Any],
                  scheme: str, act: Activation, routed_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """flavor → fp32 [rows, H] output (routed, weighted, plus the shared expert).

    `routed_scale` multiplies the routed sum when vLLM scales the routed output rather than the
    top-k weights (FusedMoE(apply_routed_scale_to_output=True), Glm4MoE). The shared MLP runs its
    own scheme (`ref["shared_scheme"]`) where the checkpoint quantizes it differently. When both parts
    quantize activations, each may run its own flavor (the shared MLP is a linear layer with a kernel of
    its own: FlashInfer's block-FP8 GEMM beside Triton experts), so every pair is offered: a flavor's own
    name where the two agree, `experts F, shared G` where they differ."""
    shared: Optional[tuple[Any, Any, Optional[torch.Tensor]]] = ref.get("shared")
    shared_scheme = ref.get("shared_scheme", scheme) if shared is not None else None
    flavors = reference_flavors(scheme, shared_scheme)
    rows = x.shape[0]
    xq = {f: act_quant_dequant(x, scheme, _own(f, scheme)) for f in flavors}
    routed = {f: torch.zeros(rows, x.shape[1], device=x.device, dtype=torch.float32) for f in flavors}
    ids, w = ids[:rows].long(), weights[:rows].float() * routed_scale
    biases = ref.get("expert_bias")
    for expert in torch.unique(ids).tolist():
        tok, slot = (ids == expert).nonzero(as_tuple=True)
        q1, q2 = ref["experts"][expert]
        w1, w2 = q1.dequant(), q2.dequant()
        b1, b2 = (None, None) if biases is None else (biases[0][expert], biases[1][expert])
        scale = w[tok, slot].unsqueeze(1)
        for f in flavors:
            routed[f].index_add_(0, tok, _mlp(xq[f][tok], w1, w2, scheme, _own(f, scheme), act, b1, b2) * scale)
        del w1, w2
    if shared is None:
        return routed
    assert shared_scheme is not None
    q1, q2, sgate = shared
    w1, w2 = q1.dequant(), q2.dequant()
    shared_out: dict[str, torch.Tensor] = {}
    for g in ACT_FLAVORS[shared_scheme] if ACT_FLAVORS[scheme] != ("none",) else flavors:
        own = _own(g, shared_scheme)
        y = _mlp(act_quant_dequant(x, shared_scheme, own), w1, w2, shared_scheme, own, act)
        if sgate is not None:
            y = y * torch.sigmoid(x.float() @ sgate.float().T)
        shared_out[g] = y
    if ACT_FLAVORS[scheme] == ("none",):         # weight-only experts: the shared MLP's flavors name the output
        return {g: routed[flavors[0]] + y for g, y in shared_out.items()}
    if len(shared_out) == 1:                     # a bf16 shared MLP: the experts' flavors name it
        (y,) = shared_out.values()
        return {f: r + y for f, r in routed.items()}
    return {(f if f == g else f"experts {f}, shared {g}"): r + y
            for f, r in routed.items() for g, y in shared_out.items()}
