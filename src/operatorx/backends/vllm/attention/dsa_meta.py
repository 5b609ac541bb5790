"""What an mla_dsa row records about the vLLM build: both backends, both caches, the split, the graph (imports
vLLM when called). Why apart from dsa_build: the build stays one job, this the record of it."""

from __future__ import annotations

from typing import Any, Optional

from operatorx.backends.torch.attention.dsa import mla_args
from operatorx.backends.torch.attention.mla import softmax_scale
from operatorx.backends.vllm.attention.build import builder_split, graph_notes
from operatorx.backends.vllm.attention.dsa_support import WK_UPCAST, wk_upcast
from operatorx.backends.vllm.attention.run_facts import run_facts
from operatorx.backends.vllm.attention.support import DEEPSEEK_MLA
from operatorx.backends.vllm.common import class_name
from operatorx.spec.attention import MlaDsaArgs

__all__ = ["dsa_metadata"]


def _cache(t: Any, spec: Any) -> dict[str, Any]:
    return {"spec": class_name(spec), "shape": list(t.shape), "stride": list(t.stride()),
            "dtype": str(t.dtype).replace("torch.", ""), "block_size": spec.block_size,
            "bytes": t.numel() * t.element_size()}


def _indexer(args: MlaDsaArgs, b: Any, index_part: Any) -> tuple[dict[str, Any], Optional[dict[str, Any]]]:
    """What the row records of the indexer (an own one's backend, cache and wk; a reuse layer's read buffer),
    and an own indexer builder's decode/prefill split (None for a reuse layer)."""
    if index_part is None:
        return {"indexer": {"kind": "reuse", "skip_topk": bool(b.module.mla_attn.skip_topk),
                            "topk_indices": "an earlier layer's picks: dsa_reuse.reused_topk (uniform distinct "
                                            "request-relative positions, every key when a token sees <= topk)"}}, None
    indexer, index_spec = b.module.indexer, index_part.spec
    return {
        "index_layer": b.index_name,
        "index_backend": {"name": index_part.backend.get_name(),
                          "builder": type(index_part.builder).__name__, "metadata": class_name(b.index_metadata),
                          "fused_q_rope_quant": getattr(indexer, "use_fused_indexer_q", None),
                          "scale_fmt": getattr(indexer, "scale_fmt", None),
                          "topk": getattr(indexer, "topk_tokens", None)},
        "indexer_rotary_embedding": {"class": class_name(b.module.indexer_rope_emb),
                                     "neox": bool(b.module.indexer_rope_emb.is_neox_style)},
        "index_cache": {**_cache(b.index_cache, index_spec),
                        "row": f"per block: block_size x {args.index_dim} e4m3 keys, then block_size fp32 ue8m0 "
                               "scales"},
        "indexer_wk": WK_UPCAST if wk_upcast(args) else "bf16, fused with weights_proj into wk_weights_proj",
    }, {k: getattr(b.index_metadata, k, None) for k in ("num_decodes", "num_prefills", "num_decode_tokens")}


def dsa_metadata(args: MlaDsaArgs, b: Any, builder: Any, index_part: Any, spec: Any, size: Optional[int], mode: str,
                 graph_error: Optional[str]) -> dict[str, Any]:
    """The row's record; `index_part`: dsa_build.IndexPart, None for a reuse layer."""
    from vllm.config import CacheConfig

    from operatorx.backends.vllm.env import vllm_version

    backend, impl, md = b.attn.attn_backend, b.attn.impl, b.attn_metadata
    indexer, index_split = _indexer(args, b, index_part)
    meta: dict[str, Any] = {
        "framework": f"vllm {vllm_version()}",
        "module": DEEPSEEK_MLA.path,
        "layer": b.layer_name,
        "attention_backend": {"name": backend.get_name(), "class": backend.__name__, "impl": class_name(impl),
                              "sparse": bool(backend.is_sparse())},
        **indexer,
        "metadata_builder": type(builder).__name__,
        "metadata": class_name(md),
        "reorder_batch_threshold": getattr(builder, "reorder_batch_threshold", None),
        "rotary_embedding": class_name(b.module.rotary_emb),
        "softmax_scale": {"vllm": float(b.attn.scale), "reference": softmax_scale(mla_args(args))},
        "kv_cache": {**_cache(b.kv_cache, spec), "cache_dtype": b.attn.kv_cache_dtype,
                     "block_size_rule": f"{backend.get_name()}.get_preferred_block_size("
                                        f"{CacheConfig.DEFAULT_BLOCK_SIZE}) = {spec.block_size}",
                     "row": f"[kv_lora_rank {args.kv_lora_rank} normed latent | rope_dim {args.rope_dim} rope key]",
                     "num_blocks": b.index.num_blocks, "reserved_blocks": "block 0 (vLLM's null block)",
                     "pages": b.layout.pages},
        "topk_indices_buffer": {"shape": list(b.topk_indices.shape), "dtype": str(b.topk_indices.dtype)},
        "requests": {**b.index.region_counts(), "batch_reordered": b.index.reordered,
                     "builder_split": builder_split(md, b.index, builder),
                     **({} if index_split is None else {"index_split": index_split})},
        **run_facts(b.config, b.graph, size, mode),
        "synthetic_weights": "random N(0, 1/in) bf16 (dsa_weights), norms near 1, LayerNorm bias near 0",
        "ctx": b.layout.ctx_summary(),
    }
    return graph_notes(meta, b.graph, size, b.index.num_tokens, graph_error)
