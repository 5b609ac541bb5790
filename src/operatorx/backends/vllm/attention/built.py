"""The fields and the eager call every built vllm attention module shares (gqa, mla, mla_dsa, gdn/kda).

The rule: the eager call is the module's forward inside vLLM's forward context with each of the module's
layers' metadata (and slot mappings where the layer writes a paged cache), `num_tokens` the batch's; a
subclass names its forward's arguments and, where it has more than one layer, the layers. Rows are kept
in vLLM's batch order and put back in the layout's order for the check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from operatorx.backends.torch.attention.layout import Layout
from operatorx.backends.vllm.attention.batch import BatchIndex
from operatorx.backends.vllm.graphs import CapturedCall, GraphOrEager
from operatorx.backends.vllm.quant_map import Plan

__all__ = ["BuiltModule", "BuiltPaged", "layout_order"]


def layout_order(out: torch.Tensor, index: BatchIndex) -> torch.Tensor:
    """The module's output rows (batch order) put back in the layout's row order."""
    return torch.empty_like(out).index_copy_(0, index.rows.to(out.device), out)


@dataclass(kw_only=True)
class BuiltModule(GraphOrEager):
    module: Any
    layer_name: str
    config: Any
    layout: Layout
    index: BatchIndex
    x: torch.Tensor
    """[T, hidden] in layout order (the reference's input)."""
    x_batch: torch.Tensor
    """The same rows in vLLM's batch order (the module's input)."""
    positions: torch.Tensor
    attn_metadata: Any
    forward_context: Any
    """vllm.forward_context.set_forward_context."""
    graph: Optional[CapturedCall] = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def layer_metadata(self) -> dict[str, Any]:
        """The attention metadata of each layer the forward reads, by layer name."""
        return {self.layer_name: self.attn_metadata}

    def slot_mappings(self) -> Optional[dict[str, torch.Tensor]]:
        """The slot mapping of each layer that writes a paged cache; None when none does."""
        return None

    def forward(self) -> torch.Tensor:
        """The module's own forward on (positions, x_batch), as its model calls it."""
        raise NotImplementedError

    def eager(self) -> torch.Tensor:
        slots = self.slot_mappings()
        extra: dict[str, Any] = {} if slots is None else {"slot_mapping": slots}
        with torch.no_grad(), self.forward_context(self.layer_metadata(), self.config,
                                                   num_tokens=self.index.num_tokens, **extra):
            return self.forward()

    def in_layout_order(self, out: torch.Tensor) -> torch.Tensor:
        """The module's output rows (batch order) put back in the layout's row order."""
        return layout_order(out, self.index)


@dataclass(kw_only=True)
class BuiltPaged(BuiltModule):
    """A module over a paged KV cache (gqa, mla, mla_dsa): its attention layer writes the cache through
    the batch's slot mapping."""

    attn: Any
    """The module's attention layer (Attention, MLAAttention)."""
    kv_cache: torch.Tensor
    """The logical view of the cache the layer holds (its backend's kv-cache shape)."""
    slot_mapping: torch.Tensor
    plan: Plan
    """The projections' plan (bf16 or block FP8)."""

    def slot_mappings(self) -> dict[str, torch.Tensor]:
        return {self.layer_name: self.slot_mapping}
