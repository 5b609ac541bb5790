"""One DeepSeek-V4 attention (dsv4_attn) module's weights, as vLLM 0.26's DeepseekV4Attention holds them.

The module (models/deepseek_v4/attention.py) owns wq_a and wkv (fused as fused_wqa_wkv), q_norm and kv_norm
(RMSNorm), wq_b, the grouped wo_a, wo_b and attn_sink (fp32, one logit per head); a compressed layer (ratio
4 or 128) a DeepseekCompressor (compressor.py: wkv and wgate fused as fused_wkv_wgate, bf16 with
quant_config=None; ape fp32 [ratio, coff·head_dim]; an RMSNorm over head_dim); a ratio-4 layer also a
DeepseekV4Indexer (wq_b, weights_proj bf16 with quant_config=None, and its own compressor at index_dim).
The projections vLLM runs in block FP8 (wq_a, wkv, wq_b, wo_a, wo_b, indexer.wq_b) are drawn as bf16 values
exact in e4m3 x ue8m0 128x128 blocks (`block_fp8`), so the reference and vLLM hold the very same values.
Why one dataclass: the reference and the vLLM build load and read one set.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

import torch

from operatorx.backends.torch.attention.gqa import _linear, _norm
from operatorx.spec.attention import Dsv4AttnArgs

__all__ = ["CompressorWeights", "DSV4_NORM_EPS", "Dsv4Weights", "FP8_BLOCK", "FP8_PROJECTIONS", "IndexerWeights",
           "block_fp8", "compressor_coff", "dsv4_weights"]

#: rms_norm_eps of DeepSeek-V4's config (every RMSNorm of the module: q_norm, kv_norm, the compressors',
#: the per-head q norm); the vLLM build must give its config stand-in this value.
DSV4_NORM_EPS = 1e-6
#: The projections vLLM 0.26 runs in block FP8 under DeepseekV4FP8Config (the compressors' fused_wkv_wgate
#: and the indexer's weights_proj are built with quant_config=None, so bf16).
FP8_PROJECTIONS = ("wq_a", "wkv", "wq_b", "wo_a", "wo_b", "indexer.wq_b")
#: The weight block one ue8m0 scale covers (DeepSeek-V4's weight_block_size).
FP8_BLOCK = 128
_E4M3_MAX = 448.0


def compressor_coff(ratio: int) -> int:
    """2 at ratio 4 (overlapping windows: each entry pools 2·ratio tokens), else 1 (compressor.py coff)."""
    return 2 if ratio == 4 else 1


def block_fp8(w: torch.Tensor, block: int = FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 [N, K], fp32 power-of-two scales [ceil(N/block), ceil(K/block)]) of weight w [N, K]: per block,
    scale = 2^ceil(log2(amax / 448)) (ue8m0), q = round(w / scale). Partial edge blocks are allowed (small
    test sizes); q · scale is what the layer computes with."""
    rows, cols = w.shape
    wf = w.float()
    padded = torch.nn.functional.pad(wf, (0, -cols % block, 0, -rows % block))
    blocks = padded.view(padded.shape[0] // block, block, padded.shape[1] // block, block)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-30)
    scale = torch.exp2(torch.ceil(torch.log2(amax / _E4M3_MAX)))
    full = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)[:rows, :cols]
    q = (wf / full).clamp(-_E4M3_MAX, _E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def _fp8_exact(w: torch.Tensor) -> torch.Tensor:
    """bf16 w rounded to the nearest e4m3 x ue8m0-block value (exact in bf16: 3 mantissa bits, a power of two)."""
    q, scale = block_fp8(w)
    full = scale.repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)[:w.shape[0], :w.shape[1]]
    exact = q.float() * full
    out = exact.to(torch.bfloat16)
    if not torch.equal(out.float(), exact):
        raise RuntimeError("block FP8: a dequantized weight is not exact in bf16")
    return out


@dataclass
class CompressorWeights:
    """DeepseekCompressor's parameters (compressor.py:189-303); head = head_dim (main) or index_dim (indexer)."""

    wkv: torch.Tensor             # bf16 [coff·head, hidden]: fused_wkv_wgate shard 0
    wgate: torch.Tensor           # bf16 [coff·head, hidden]: fused_wkv_wgate shard 1
    ape: torch.Tensor             # fp32 [ratio, coff·head]: added to the gate score per position in the window
    norm: torch.Tensor            # bf16 [head]: RMSNorm weight over the pooled entry

    @property
    def ratio(self) -> int:
        return int(self.ape.shape[0])

    @property
    def head(self) -> int:
        return int(self.norm.shape[0])

    @property
    def coff(self) -> int:
        return int(self.wkv.shape[0]) // self.head


@dataclass
class IndexerWeights:
    """DeepseekV4Indexer's parameters (attention.py:668-751): no wk, its keys come from its compressor."""

    wq_b: torch.Tensor            # bf16 [index_heads·index_dim, q_lora_rank] (block FP8 in vLLM)
    weights_proj: torch.Tensor    # bf16 [index_heads, hidden] (quant_config=None)
    compressor: CompressorWeights


@dataclass
class Dsv4Weights:
    wq_a: torch.Tensor            # bf16 [q_lora_rank, hidden]: fused_wqa_wkv shard 0
    wkv: torch.Tensor             # bf16 [head_dim, hidden]: fused_wqa_wkv shard 1
    q_norm: torch.Tensor          # bf16 [q_lora_rank]
    kv_norm: torch.Tensor         # bf16 [head_dim]
    wq_b: torch.Tensor            # bf16 [heads·head_dim, q_lora_rank]
    wo_a: torch.Tensor            # bf16 [o_groups·o_lora_rank, heads·head_dim // o_groups]
    wo_b: torch.Tensor            # bf16 [hidden, o_groups·o_lora_rank]
    attn_sink: torch.Tensor       # fp32 [heads]
    compressor: Optional[CompressorWeights] = None
    indexer: Optional[IndexerWeights] = None

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor by dotted name ("compressor.ape", "indexer.compressor.wkv", ...)."""
        out: dict[str, torch.Tensor] = {}

        def walk(prefix: str, obj: object) -> None:
            for f in fields(obj):  # type: ignore[arg-type]
                value = getattr(obj, f.name)
                if isinstance(value, torch.Tensor):
                    out[prefix + f.name] = value
                elif value is not None:
                    walk(f"{prefix}{f.name}.", value)

        walk("", self)
        return out

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())


def _compressor(ratio: int, head: int, hidden: int, gen: torch.Generator, device: str) -> CompressorWeights:
    coff = compressor_coff(ratio)
    wkv = _linear(coff * head, hidden, gen, device)
    wgate = _linear(coff * head, hidden, gen, device)
    ape = 0.5 * torch.randn(ratio, coff * head, generator=gen, device=device, dtype=torch.float32)
    return CompressorWeights(wkv, wgate, ape, _norm(head, gen, device))


def dsv4_weights(args: Dsv4AttnArgs, gen: torch.Generator, device: str) -> Dsv4Weights:
    """Random weights: projections N(0, 1/in) as mla_weights draws them (the FP8_PROJECTIONS rounded to
    e4m3 x ue8m0 blocks), norms near 1, attn_sink N(0, 1) fp32, ape N(0, 1/4) fp32; a compressor at ratio
    4 / 128 when the layer is a source, the indexer (with its own index_dim compressor) at ratio 4."""
    h, hd, heads, g = args.hidden, args.head_dim, args.heads, args.o_groups
    wq_a = _fp8_exact(_linear(args.q_lora_rank, h, gen, device))
    wkv = _fp8_exact(_linear(hd, h, gen, device))
    q_norm = _norm(args.q_lora_rank, gen, device)
    kv_norm = _norm(hd, gen, device)
    wq_b = _fp8_exact(_linear(heads * hd, args.q_lora_rank, gen, device))
    wo_a = _fp8_exact(_linear(g * args.o_lora_rank, heads * hd // g, gen, device))
    wo_b = _fp8_exact(_linear(h, g * args.o_lora_rank, gen, device))
    attn_sink = torch.randn(heads, generator=gen, device=device, dtype=torch.float32)
    r = args.compress_ratio
    compressor = _compressor(r, hd, h, gen, device) if r > 1 and args.source else None
    indexer = None
    if r == 4 and args.indexer is not None:
        assert args.index_heads is not None and args.index_dim is not None
        ih, idim = args.index_heads, args.index_dim
        indexer = IndexerWeights(_fp8_exact(_linear(ih * idim, args.q_lora_rank, gen, device)),
                                 _linear(ih, h, gen, device), _compressor(r, idim, h, gen, device))
    return Dsv4Weights(wq_a, wkv, q_norm, kv_norm, wq_b, wo_a, wo_b, attn_sink, compressor, indexer)
