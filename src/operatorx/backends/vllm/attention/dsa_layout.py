"""The indexer's fp8 key cache as vLLM 0.26 lays it out, written and read in plain torch (no vLLM import).

The rule (Indexer: DeepseekV32IndexerCache(head_dim = index_dim + index_dim / 128 · 4, uint8), its
backend's get_kv_cache_shape (blocks, block_size, head_dim), and the insert kernel
indexer_k_quant_and_cache, whose layout the Triton port in v1/attention/ops/rocm_aiter_mla_sparse.py
spells out for block_size > 1 on CUDA's "NORMAL" path): each block's bytes are block_size · index_dim
e4m3 values, token-major (token t's key at t · index_dim), then block_size fp32 scales (token t's at
t), one per token for index_dim 128. A token's scale is amax/448 rounded up to a power of two (ue8m0,
the Indexer's scale_fmt), at least 1e-4/448. Why here: the cache is filled with keys the reference
reads back exactly, and both sides follow one layout that a CPU test pins.
"""

from __future__ import annotations

import torch

from operatorx.backends.torch.attention.layout import Request
from operatorx.backends.vllm.attention.batch import block_offsets

__all__ = ["E4M3_MAX", "index_cache_width", "quantize_keys", "pack_index_block", "read_index_keys"]

#: Largest finite float8_e4m3fn.
E4M3_MAX = 448.0
#: The smallest amax the insert kernel scales by.
AMAX_FLOOR = 1e-4


def index_cache_width(index_dim: int, quant_block: int = 128) -> int:
    """Bytes per token of the indexer cache: index_dim e4m3 values and one fp32 scale per quant_block."""
    return index_dim + index_dim // quant_block * 4


def quantize_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """keys [..., index_dim] -> (e4m3 values, fp32 scales [...]) with one ue8m0 scale per key (module docstring)."""
    amax = keys.float().abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    scale = torch.exp2(torch.ceil(torch.log2(amax / E4M3_MAX)))
    values = (keys.float() / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return values, scale


def pack_index_block(keys: torch.Tensor) -> torch.Tensor:
    """keys [blocks, block_size, index_dim] -> uint8 [blocks, block_size, width], each block's bytes laid out
    as the module docstring says (values then scales)."""
    blocks, size, dim = keys.shape
    values, scale = quantize_keys(keys)
    flat = torch.cat((values.view(torch.uint8).reshape(blocks, size * dim),
                      scale.contiguous().view(torch.uint8).reshape(blocks, size * 4)), dim=1)
    return flat.view(blocks, size, index_cache_width(dim))


def _dequantized(cache: torch.Tensor, index_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values [blocks, block_size, index_dim] as fp32, scales [blocks, block_size]) of a uint8 cache."""
    blocks, size, width = cache.shape
    if width != index_cache_width(index_dim):
        raise ValueError(f"indexer cache width {width}: expected {index_cache_width(index_dim)} for index_dim "
                         f"{index_dim}")
    flat = cache.reshape(blocks, size * width)
    values = flat[:, :size * index_dim].contiguous().view(torch.float8_e4m3fn).view(blocks, size, index_dim)
    scales = flat[:, size * index_dim:].contiguous().view(torch.float32).view(blocks, size)
    return values.float(), scales


def read_index_keys(cache: torch.Tensor, r: Request, index_dim: int) -> torch.Tensor:
    """fp32 [ctx, index_dim]: the request's cached indexer keys (positions 0 .. ctx - 1), values · scale, read
    through its blocks (batch.block_offsets: vLLM's block = layout page + 1)."""
    blocks, offsets = (t.to(cache.device) for t in block_offsets(r, 0, r.ctx))
    used = blocks.unique()                                  # sorted: only the request's blocks are decoded
    values, scales = _dequantized(cache[used], index_dim)
    local = torch.searchsorted(used, blocks)
    return values[local, offsets] * scales[local, offsets][:, None]
