"""The batch of a linear-attention case as vLLM's mamba state blocks hold it (CPU, no vLLM import).

The rule (vLLM 0.26, mamba_cache_mode "none", prefix caching off): a mamba layer's block is one whole
sequence (cache_config.mamba_block_size = max_model_len, model_executor/models/config.py), so each
request holds exactly one block, its state slot, and the GDN builder reads the slot as block_table[:, 0]
(GDNAttentionMetadataBuilder.build: non_spec_state_indices_tensor). Block 0 is vLLM's null block, which
the kernels skip (fused_sigmoid_gating: `state_idx <= 0: return`), so request i's slot is its layout
page + 1 (batch.py's RESERVED_BLOCKS). The layout is plan_layout's with one page a request: pages of
`block_tokens` = the longest request's ctx + q; `pages: shuffled` scatters the slots.
Why here: the slots, the reference and the state fill all read this one plan.
"""

from __future__ import annotations

import torch

from operatorx.backends.torch.attention.layout import Layout, Request, plan_layout
from operatorx.backends.vllm.attention.batch import RESERVED_BLOCKS, BatchIndex
from operatorx.spec.attention import Batch

__all__ = ["state_layout", "state_slot", "state_slots", "batch_state_indices"]


def state_layout(batch: Batch) -> Layout:
    """The batch with one page (state block) a request, the page as long as the longest request."""
    longest = max(r.ctx + r.q for r in plan_layout(batch).requests)
    layout = plan_layout(batch, None, longest)
    assert all(len(r.pages) == 1 for r in layout.requests), "a request spans more than one state block"
    return layout


def state_slot(r: Request) -> int:
    """The request's state block in vLLM's state tensors."""
    return r.pages[0] + RESERVED_BLOCKS


def state_slots(layout: Layout) -> torch.Tensor:
    """int64 [requests]: every request's state block, in layout order."""
    return torch.tensor([state_slot(r) for r in layout.requests], dtype=torch.int64)


def batch_state_indices(index: BatchIndex) -> torch.Tensor:
    """int32 [requests]: the state block of each request in vLLM's batch order, as the GDN builder reads it."""
    return index.block_table[:, 0]
