"""The layout's batch as vLLM's model runner hands it to an attention metadata builder (CPU tensors).

The rules, each as vLLM 0.26 has it:
- block 0 is the null block (v1/attention/backends/utils.py NULL_BLOCK_ID = 0): the runner pads block
  tables with it and never gives it to a request, so page p of the layout is vLLM block p + 1, the pool
  holds pool_pages + 1 blocks and a slot is block · page_tokens + offset (the layout's page size, which
  is vLLM's block size: 16 for the gqa backends, what the MLA backend asks for with mla);
- each request reads `seq_lens` = ctx + q tokens, `num_computed_tokens` = ctx, its new tokens at
  positions ctx .. ctx + q - 1;
- a builder with a `reorder_batch_threshold` gets the batch reordered as the runner's
  reorder_batch_to_split_decodes_and_prefills does: decode (a context and at most threshold new
  tokens) -> long extend (a context and more) -> prefill (no context), stable within each region;
  a builder without one (FlashAttention) gets the layout's order. A request with a context and at
  most threshold new tokens is taken as a decode (its prompt all cached: `is_prefilling` False).
Why CPU tensors here: the builder's inputs are plain index arithmetic, testable without vLLM or a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from operatorx.backends.torch.attention.layout import Layout, Request

__all__ = ["RESERVED_BLOCKS", "REGIONS", "BatchIndex", "batch_index", "region_of", "vllm_slots", "block_offsets",
           "cached_latents"]

#: Blocks before the layout's pages: vLLM's null block.
RESERVED_BLOCKS = 1
#: The runner's batch regions, in its order.
REGIONS = ("decode", "long_extend", "prefill")


def region_of(r: Request, threshold: int) -> str:
    if r.ctx == 0:
        return "prefill"
    return "decode" if r.q <= threshold else "long_extend"


def vllm_slots(r: Request, start: int, stop: int) -> torch.Tensor:
    """vLLM's slots (int64) of the request's positions start .. stop - 1: the layout's, one block on."""
    return r.slots(start, stop) + RESERVED_BLOCKS * r.page_tokens


def block_offsets(r: Request, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(vLLM block, offset in the block) of the request's positions start .. stop - 1 (int64, CPU): where
    a kernel reading the cache through the block table finds each token."""
    slots = vllm_slots(r, start, stop)
    return slots // r.page_tokens, slots % r.page_tokens


def cached_latents(kv_cache: torch.Tensor, r: Request, k_scale: float = 1.0) -> torch.Tensor:
    """fp32 [ctx, kv_lora_rank + rope_dim]: the request's cached positions 0 .. ctx - 1 read from an MLA cache
    [num_blocks, block_size, kv_lora_rank + rope_dim] through its blocks, each row as vLLM's
    concat_and_cache_mla writes it (the normed latent, then the rope key). An fp8 cache (uint8 storage) holds
    e4m3 values of row / k_scale, so the row read back is the e4m3 value times k_scale."""
    blocks, offsets = (t.to(kv_cache.device) for t in block_offsets(r, 0, r.ctx))
    rows = kv_cache[blocks, offsets]
    if rows.dtype == torch.uint8:
        return rows.view(torch.float8_e4m3fn).float() * k_scale
    return rows.float()


@dataclass(frozen=True)
class BatchIndex:
    """The batch in vLLM's order; every tensor on the CPU."""

    order: tuple[int, ...]
    """Layout request indices in batch order."""
    regions: tuple[str, ...]
    """Each batch request's region (REGIONS)."""
    reordered: bool
    """True when the builder asked for the runner's decode-first order."""
    query_start_loc: torch.Tensor       # int32 [n + 1]
    seq_lens: torch.Tensor              # int32 [n]
    num_computed: torch.Tensor          # int32 [n]
    is_prefilling: torch.Tensor         # bool [n]
    block_table: torch.Tensor           # int32 [n, widest request's blocks], padded with the null block
    slot_mapping: torch.Tensor          # int64 [T]
    positions: torch.Tensor             # int64 [T]
    rows: torch.Tensor                  # int64 [T]: the layout row (of x) each batch token is
    max_query_len: int
    max_seq_len: int
    num_blocks: int
    """Blocks of the KV cache: the layout's pool plus the reserved ones."""

    @property
    def num_tokens(self) -> int:
        return int(self.rows.numel())

    def region_counts(self) -> dict[str, int]:
        return {name: sum(1 for g in self.regions if g == name) for name in REGIONS}


def batch_index(layout: Layout, reorder_threshold: Optional[int]) -> BatchIndex:
    """The builder's inputs for the layout (module docstring); `reorder_threshold` is the builder's
    `reorder_batch_threshold` (None: no reordering, and decodes are single tokens)."""
    threshold = 1 if reorder_threshold is None else reorder_threshold
    requests = layout.requests
    order = list(range(len(requests)))
    if reorder_threshold is not None:
        order.sort(key=lambda i: REGIONS.index(region_of(requests[i], threshold)))
    batch = [requests[i] for i in order]
    regions = tuple(region_of(r, threshold) for r in batch)
    q = torch.tensor([r.q for r in batch], dtype=torch.int32)
    ctx = torch.tensor([r.ctx for r in batch], dtype=torch.int32)
    start = torch.zeros(len(batch) + 1, dtype=torch.int32)
    start[1:] = torch.cumsum(q, 0)
    width = max(len(r.pages) for r in batch)
    table = torch.zeros(len(batch), width, dtype=torch.int32)        # NULL_BLOCK_ID padding
    for i, r in enumerate(batch):
        table[i, :len(r.pages)] = torch.tensor(r.pages, dtype=torch.int32) + RESERVED_BLOCKS
    return BatchIndex(
        order=tuple(order), regions=regions, reordered=reorder_threshold is not None,
        query_start_loc=start, seq_lens=ctx + q, num_computed=ctx,
        is_prefilling=torch.tensor([g != "decode" for g in regions], dtype=torch.bool),
        block_table=table,
        slot_mapping=torch.cat([vllm_slots(r, r.ctx, r.ctx + r.q) for r in batch]),
        positions=torch.cat([torch.arange(r.ctx, r.ctx + r.q, dtype=torch.int64) for r in batch]),
        rows=torch.cat([torch.arange(r.row0, r.row0 + r.q, dtype=torch.int64) for r in batch]),
        max_query_len=max(r.q for r in batch), max_seq_len=max(r.ctx + r.q for r in batch),
        num_blocks=layout.pool_pages + RESERVED_BLOCKS)
