"""What one attention-module call costs, split by part: the building blocks each attention type's
`cost()` (spec/attention.py) adds up, and the breakdown it returns.

The count is the format's, not a kernel's: multiply-adds of the projections and of the attention
over each request's context (2 FLOPs each), and the fewest bytes the call must move (each weight,
the module's input and output, the cache and state it reads and writes, once). Elementwise work
(norms, RoPE, activations, gate multiplies, top-k comparisons) is left out: it is O(tokens x width),
below the projections. docs/case-format.md, "Attention types: FLOPs and bytes", gives every term.

Sums run in exact fractions, so a ctx range's mean (half-integer) and a compressed cache's
fractional length (ctx / ratio) round once, at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import floor
from typing import Literal, Optional

from operatorx.spec.operand import Operand

__all__ = ["AttentionCost", "CostPart", "CostTally", "attended", "ACTIVATION_BYTES"]

#: The module's input and output element width: bf16 hidden states (the format's activations).
ACTIVATION_BYTES = 2
#: A projection left out of `proj` is bf16.
_BF16_WEIGHT_BYTES = 2

CostPart = Literal["projection_flops", "attention_flops", "projection_bytes", "cache_bytes", "state_bytes"]


@dataclass(frozen=True)
class AttentionCost:
    """One call's FLOPs and fewest bytes, by part.

    - projection_flops: the per-token GEMMs (q/kv/o, the low-rank and indexer projections).
    - attention_flops: work over each request's context: QKᵀ and PV, the indexer's scores,
      MLA's up-projection of cached latents where that form is the cheaper, linear attention's
      conv and recurrence.
    - projection_bytes: every projection weight (as its `proj` operand stores it) plus the
      module's input and output hidden states.
    - cache_bytes: KV / latent / index cache read for the context and written for the new tokens.
    - state_bytes: recurrent and conv state (gdn, kda) and the DeepSeek-V4 compressor's state.
    """

    projection_flops: int
    attention_flops: int
    projection_bytes: int
    cache_bytes: int
    state_bytes: int

    @property
    def flops(self) -> int:
        return self.projection_flops + self.attention_flops

    @property
    def bytes(self) -> int:
        return self.projection_bytes + self.cache_bytes + self.state_bytes

    def part_seconds(self, peak_tflops: float, peak_gbps: float) -> dict[CostPart, float]:
        """Each part's time alone at the peak pair: its FLOPs at peak_tflops, its bytes at peak_gbps."""
        if peak_tflops <= 0 or peak_gbps <= 0:
            raise ValueError(f"peaks must be positive, got {peak_tflops} TFLOP/s and {peak_gbps} GB/s")
        f, b = peak_tflops * 1e12, peak_gbps * 1e9
        return {"projection_flops": self.projection_flops / f, "attention_flops": self.attention_flops / f,
                "projection_bytes": self.projection_bytes / b, "cache_bytes": self.cache_bytes / b,
                "state_bytes": self.state_bytes / b}

    def dominant(self, peak_tflops: float, peak_gbps: float) -> CostPart:
        """The part whose roofline time is the longest on this peak pair (the first in field order on a tie).

        Roofline time, not a raw share: FLOPs and bytes only compare once priced at a device's rates,
        and the same case is bound by its cache on one GPU and by its projections on another.
        """
        times = self.part_seconds(peak_tflops, peak_gbps)
        return max(times, key=lambda part: times[part])


def attended(ctx: Fraction, q: int, cap: Optional[int] = None, ratio: int = 1) -> Fraction:
    """Σ_{j=1..q} min((ctx + j) / ratio, cap): the keys q new tokens attend in all, causal.

    New token j sees the ctx cached tokens and itself and the j-1 new ones before it; `ratio`
    counts them in compressed entries (one per `ratio` tokens), `cap` (a window, top-k or budget)
    caps what one token attends. Closed form, so a 32k-token prefill costs no loop.
    """
    if cap is None:
        k = q
    else:
        k = min(q, max(0, floor(ratio * cap - ctx)))
    under = (k * ctx + Fraction(k * (k + 1), 2)) / ratio
    return under + (q - k) * (cap or 0)


class CostTally:
    """The running sums of one `cost()` call (T = the batch's new tokens)."""

    def __init__(self, tokens: int, hidden: int) -> None:
        self.tokens = tokens
        self.projection_flops = 0
        self.projection_bytes = 2 * tokens * hidden * ACTIVATION_BYTES     # input read, output written
        self.attention_flops = Fraction(0)
        self.cache_bytes = Fraction(0)
        self.state_bytes = Fraction(0)

    def linear(self, weight: Optional[Operand], in_features: int, out_features: int) -> None:
        """One projection over every new token: 2·T·in·out FLOPs; its weight [out, in] read once,
        as `weight` stores it (None: bf16)."""
        self.projection_flops += 2 * self.tokens * in_features * out_features
        self.projection_bytes += (weight.bytes(out_features, in_features, weight=True) if weight is not None
                                  else out_features * in_features * _BF16_WEIGHT_BYTES)

    def result(self) -> AttentionCost:
        return AttentionCost(projection_flops=self.projection_flops, attention_flops=round(self.attention_flops),
                             projection_bytes=self.projection_bytes, cache_bytes=round(self.cache_bytes),
                             state_bytes=round(self.state_bytes))
