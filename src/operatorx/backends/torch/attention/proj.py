"""The torch attention modules' projections: F.linear for bf16, F.scaled_mm for block FP8.

The rule: a case's projections are all bf16 or all block FP8 (128x128 e4m3 weights, activations
quantized inside the call in 1x128 groups with the scale dtype the case gives, fp32 or ue8m0); the
fp8 layer is what the torch gemm backend runs for the same pair (cuBLASLt's 1x128 x 128x128 recipe),
with the activation's quantization timed as part of the call (it arrives in bf16). The reference
reads the dequantized weights and quantizes its activations the same way (`Projection.reference_input`).
Anything else is refused by field (`projection_refusal`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from operatorx.backends.torch.quant import dequantize, quantize
from operatorx.backends.torch.scaled_mm import Recipe, scale_a_layout, scale_b_layout
from operatorx.spec.attention import AttentionArgs, GqaArgs, MlaArgs
from operatorx.spec.operand import Operand, Scale

__all__ = ["Projection", "projection_scheme", "projection_refusal", "make_projection", "module_projections"]

_RECIPE = Recipe("block_1x128_128x128", "BlockWise1x128", "BlockWise128x128")
_BLOCK = (128, 128)


def module_projections(args: AttentionArgs) -> tuple[str, ...]:
    """The projections the case's module has: its type's, less an MLA's g_proj when it has no gate."""
    if isinstance(args, MlaArgs) and not args.gate:
        return tuple(n for n in args.PROJECTIONS if n != "g_proj")
    return args.PROJECTIONS


def _block_fp8(a: Operand, b: Operand) -> bool:
    sa, sb = a.scale, b.scale
    return (a.dtype == "e4m3" and b.dtype == "e4m3" and sa is not None and sb is not None
            and a.arrives_as(activation=True) == "bf16" and not sa.static and sb.static
            and sa.oriented(weight=False) == (1, 128) and sb.oriented(weight=True) == (128, 128)
            and sa.dtype in ("fp32", "ue8m0") and sb.dtype in ("fp32", "ue8m0"))


def projection_scheme(args: AttentionArgs) -> tuple[str, Optional[Scale], Optional[Scale]]:
    """("bf16" | "fp8_block", the activation scale, the weight scale) the projections share; raises
    ValueError naming the field when they do not share one the torch backend runs."""
    kinds: dict[str, tuple[str, Optional[Scale], Optional[Scale]]] = {}
    for name in module_projections(args):
        pair = (args.proj or {}).get(name)
        if pair is None or (pair.a.dtype == "bf16" and pair.b.dtype == "bf16"
                            and pair.a.arrives_as(activation=True) == "bf16"):
            kinds[name] = ("bf16", None, None)
        elif _block_fp8(pair.a, pair.b):
            kinds[name] = ("fp8_block", pair.a.scale, pair.b.scale)
        else:
            raise ValueError(f"proj.{name}: {pair.a.scheme_name()} x {pair.b.scheme_name()}: the torch attention "
                             "backend runs bf16 projections (F.linear) or block FP8 (1x128 dynamic activations x "
                             "128x128 weights, F.scaled_mm)")
    if len({(k, None if a is None else a.model_dump_json(), None if b is None else b.model_dump_json())
            for k, a, b in kinds.values()}) > 1:
        mixed = ", ".join(f"{n}={k[0]}" for n, k in kinds.items())
        raise ValueError(f"proj: {mixed}: the torch attention backend runs one scheme on every projection")
    return next(iter(kinds.values()))


def _in_features(args: AttentionArgs) -> dict[str, int]:
    """Each projection's K (its input width), for the 1x128 activation groups."""
    if isinstance(args, MlaArgs):
        return {"q_a_proj": args.hidden, "kv_a_proj_with_mqa": args.hidden, "q_b_proj": args.q_lora_rank,
                "kv_b_proj": args.kv_lora_rank, "o_proj": args.heads * args.v}
    assert isinstance(args, GqaArgs)
    return {"q_proj": args.hidden, "k_proj": args.hidden, "v_proj": args.hidden,
            "o_proj": args.q_heads * args.head_dim}


def projection_refusal(args: AttentionArgs, device: str) -> Optional[str]:
    """None when the torch backend can run the case's projections on `device`; else why, by field."""
    try:
        scheme, _, _ = projection_scheme(args)
    except ValueError as err:
        return str(err)
    if scheme == "bf16":
        return None
    if device != "cuda":
        return f"proj: block FP8 projections run through F.scaled_mm (cuBLASLt) on CUDA, not on {device}"
    for name, k in _in_features(args).items():
        if k % 128:
            return f"proj.{name}: K={k} is not a whole number of the 1x128 activation groups block FP8 quantizes"
    return None


#: Block-FP8 activations go in whole multiples of this many rows: cuBLASLt's 1x128 scales are M-major,
#: and it refuses a leading dimension that is not 16-byte aligned (an 8193-row call); the zero rows'
#: outputs are dropped.
SCALE_ROWS = 4


@dataclass
class Projection:
    """One projection: `__call__(x)` is what the module runs; `weight` and `reference_input` what the
    fp32 reference reads (the stored weight, dequantized; the input as the layer quantizes it)."""

    weight: torch.Tensor
    """bf16 [N, K]: the weight as stored (dequantized for fp8: exact in bf16, power-of-two scales)."""
    q: Optional[torch.Tensor] = None
    q_t: Optional[torch.Tensor] = None
    scale_b: Optional[torch.Tensor] = None
    act_scale: Optional[Scale] = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.q_t is None:
            return F.linear(x, self.weight)
        assert self.act_scale is not None and self.scale_b is not None
        flat = x.reshape(-1, x.shape[-1])
        rows = flat.shape[0]
        if rows % SCALE_ROWS:
            flat = F.pad(flat, (0, 0, 0, -rows % SCALE_ROWS))
        aq, sa = quantize(flat, "e4m3", self.act_scale, weight=False)
        a_type, b_type = _RECIPE.scaling_types()
        out = F.scaled_mm(aq, self.q_t, scale_a_layout(_RECIPE, sa), a_type, self.scale_b, b_type,
                          output_dtype=torch.bfloat16)
        return out[:rows].reshape(*x.shape[:-1], out.shape[-1])

    def reference_input(self, x: torch.Tensor) -> torch.Tensor:
        """fp32 x as the layer quantizes it (x itself for bf16)."""
        if self.act_scale is None:
            return x.float()
        flat = x.float().reshape(-1, x.shape[-1])
        q, s = quantize(flat, "e4m3", self.act_scale, weight=False)
        return dequantize(q, s, (1, 128)).reshape(x.shape)


def make_projection(w: torch.Tensor, scheme: str, act_scale: Optional[Scale],
                    weight_scale: Optional[Scale]) -> Projection:
    """The projection of bf16 weight `w` [N, K] under the scheme (projection_scheme's answer)."""
    if scheme == "bf16":
        return Projection(w)
    assert act_scale is not None and weight_scale is not None
    # power-of-two scales (exact in fp32 and ue8m0 alike), so the dequantized weight is exact in bf16
    pow2 = Scale(dtype="ue8m0", static=True, group=list(weight_scale.group))
    q, s = quantize(w, "e4m3", pow2, weight=True)
    exact = dequantize(q, s, _BLOCK)
    weight = exact.to(torch.bfloat16)
    if not torch.equal(weight.float(), exact):
        raise RuntimeError("block FP8: a dequantized weight is not exact in bf16")
    return Projection(weight, q, q.t(), scale_b_layout(_RECIPE, s), act_scale)
