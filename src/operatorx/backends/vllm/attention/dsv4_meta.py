"""What a dsv4_attn row records about the vLLM build: the class, its backends, each cache, the builders' split,
the padded heads, the compress boundaries the batch's positions hit, the graph mode (imports vLLM when called).
Why apart from dsv4_build: the build stays one job, this the record of it."""

from __future__ import annotations

from typing import Any, Optional

from operatorx.backends.torch.attention.dsv4 import compressor_coff
from operatorx.backends.torch.attention.dsv4_reference import dsv4_theta
from operatorx.backends.vllm.attention.dsv4_module import AUX_STREAMS, DSV4_ATTENTION, DSV4_CACHE_DTYPE
from operatorx.backends.vllm.attention.run_facts import run_facts
from operatorx.backends.vllm.common import class_name
from operatorx.spec.attention import Dsv4AttnArgs

__all__ = ["dsv4_metadata", "boundary_facts", "graph_record", "FLASHMLA_PLAN", "SERVING_EAGER", "SERVING_FULL",
           "SERVING_PIECEWISE", "UPSTREAM_GRAPH"]

#: How serving runs a uniform decode batch within the capture sizes (no speculative decoding: with MTP a
#: uniform decode has 1 + k query tokens): vLLM auto-enables VLLM_USE_BREAKABLE_CUDAGRAPH for
#: DeepseekV4ForCausalLM, and its BreakableCUDAGraphWrapper captures the forward under the dispatcher's runtime
#: mode, FULL for such a batch (every V4 builder supports UNIFORM_BATCH); in FULL mode
#: @eager_break_during_capture runs attention_impl inside the capture.
SERVING_FULL = ("serving: one FULL graph of the whole forward (the breakable cudagraph captures a uniform decode "
                "batch in FULL mode, where @eager_break_during_capture does not break)")
#: How serving runs another batch within the capture sizes: the breakable cudagraph in PIECEWISE mode.
SERVING_PIECEWISE = ("serving: the breakable cudagraph in PIECEWISE mode: the GEMM prologue (fused_wqa_wkv, "
                     "compressor / indexer GEMMs, q/kv RMSNorm) and o_proj replay as graph segments, attention_impl "
                     "(wq_b + fused insert, compressors, indexer, FlashMLA) runs eagerly between them")
#: How serving runs a batch above the largest capture size: the dispatcher picks no graph mode (NONE).
SERVING_EAGER = "serving: eager too (above the largest capture size the dispatcher runs no graph)"
#: How InferenceX's upstream runner times it (operatorx/runners/common/vllm/attention.py _launcher).
UPSTREAM_GRAPH = ("upstream InferenceX captures one plain torch.cuda.CUDAGraph of the whole forward for a uniform "
                  "decode batch within the capture sizes, else eager")
#: The FlashMLA tile-scheduler plan: made by the build's first call and reused by every timed call.
FLASHMLA_PLAN = ("made by the build's first call and reused, so no timed call runs the planner; serving plans once "
                 "per step for each layer kind (a fresh FlashMLASchedMeta per metadata build), shared by the step's "
                 "layers of that kind")


def graph_record(captured: bool, size: Optional[int], num_tokens: int, graph_error: Optional[str]) -> dict[str, Any]:
    """The row's graph_mode / graph_note (and graph_error): a replay of the whole forward where serving runs a
    FULL graph (build.graph_rule took it), else eager, beside serving's PIECEWISE segments (`size` set: the
    batch is within the capture sizes) or serving's eager run (`size` None). Pure, so a CPU test pins each
    case."""
    rec: dict[str, Any] = {"graph_mode": "full" if captured else "eager"}
    if graph_error is not None:
        rec["graph_error"] = graph_error
    if captured:
        pad = "" if size in (None, num_tokens) else f"; vLLM would pad T={num_tokens} to {size}, timed at T"
        note = f"timed as a CUDA-graph replay of the whole forward; {SERVING_FULL}{pad}"
    elif graph_error is not None:
        note = f"timed eagerly: the capture failed; {SERVING_FULL}"
    elif size is None:
        note = f"timed eagerly; {SERVING_EAGER}"
    else:
        note = f"timed eagerly (the graph segments' launches included); {SERVING_PIECEWISE}"
    rec["graph_note"] = f"{note}; {UPSTREAM_GRAPH}"
    return rec


def _cache(g: Any) -> dict[str, Any]:
    t, spec = g.tensor, g.spec
    return {"layer": g.name, "spec": class_name(spec), "backend": g.backend.get_name(),
            "builder": class_name(g.builder), "metadata": class_name(g.metadata),
            "shape": list(t.shape), "stride": list(t.stride()), "dtype": str(t.dtype).replace("torch.", ""),
            "block_size": int(spec.block_size), "stored_per_block": int(spec.storage_block_size),
            "page_bytes": int(spec.page_size_bytes), "real_page_bytes": int(spec.real_page_size_bytes),
            "cache_dtype_str": getattr(spec, "cache_dtype_str", None),
            "sliding_window": getattr(spec, "sliding_window", None),
            "num_blocks": int(t.shape[0]), "bytes": int(t.shape[0]) * int(spec.page_size_bytes),
            "held_blocks": int(g.plan.pool_blocks), "reserved_blocks": "block 0 (vLLM's null block)"}


def boundary_facts(args: Dsv4AttnArgs, layout: Any) -> dict[str, Any]:
    """Which of the batch's new positions p close a compressed entry ((p + 1) % ratio == 0: the compressor pools
    and stores, compressor_utils.py:38); elsewhere the compress kernels launch and exit early."""
    r = args.compress_ratio
    if r <= 1:
        return {"compress_ratio": r, "note": "no compressor"}
    tokens = requests = 0
    for req in layout.requests:
        hits = sum(1 for p in range(req.ctx, req.ctx + req.q) if (p + 1) % r == 0)
        tokens += hits
        requests += hits > 0
    coff = compressor_coff(r)
    return {"compress_ratio": r, "coff": coff, "pooled_positions": coff * r,
            "boundary_tokens": tokens, "requests_at_a_boundary": requests, "new_tokens": layout.tokens,
            "serving_decode_rate": f"1 step in {r}"}


def _split(md: Any) -> dict[str, Any]:
    return {k: getattr(md, k, None) for k in ("num_decodes", "num_prefills", "num_decode_tokens", "num_prefill_tokens")}


def dsv4_metadata(args: Dsv4AttnArgs, b: Any, size: Optional[int], mode: str,
                  graph_error: Optional[str]) -> dict[str, Any]:
    """The row's record; `size`, `mode`: build.graph_rule's; `graph_error`: a failed capture's."""
    from vllm import envs

    from operatorx.backends.vllm.env import vllm_version

    module = b.module
    backend = module.backend_cls
    rotary = module.rotary_emb
    groups = b.caches
    swa_md = groups["swa"].metadata
    meta: dict[str, Any] = {
        "framework": f"vllm {vllm_version()}",
        "module": DSV4_ATTENTION.path,
        "class": type(module).__name__,
        "layer": b.layer_name,
        "attention_backend": {"name": backend.get_name(), "class": backend.__name__,
                              "sparse": bool(backend.is_sparse()), "sink": bool(backend.supports_sink())},
        "compress_ratio": {"case": args.compress_ratio, "vllm": int(module.compress_ratio)},
        "compressor": class_name(module.compressor),
        "indexer": None if module.indexer is None else {
            "class": class_name(module.indexer), "topk": int(module.indexer.topk_tokens),
            "heads": int(module.indexer.n_head), "dim": int(module.indexer.head_dim),
            "fp4_cache": bool(module.indexer.use_fp4_kv), "scale_fmt": module.indexer.scale_fmt},
        "heads": {"case": args.heads, "local": int(module.n_local_heads), "padded": int(module.padded_heads),
                  "note": "FlashMLA's fp8 decode computes the padded heads (64 or 128); q is zero-padded"},
        "kv_cache_dtype": {"case": args.kv_cache_dtype, "cache_config": DSV4_CACHE_DTYPE,
                           "vllm": module.kv_cache_dtype},
        "caches": {kind: _cache(g) for kind, g in groups.items()},
        "rotary_embedding": {"class": class_name(rotary), "table": list(rotary.cos_sin_cache.shape),
                             "dtype": str(rotary.cos_sin_cache.dtype).replace("torch.", ""),
                             "neox": bool(rotary.is_neox_style), "theta": dsv4_theta(args)},
        "softmax_scale": float(module.scale),
        "topk_indices_buffer": {"shape": list(b.topk_indices.shape), "dtype": str(b.topk_indices.dtype)},
        "aux_streams": {"count": AUX_STREAMS if b.aux_streams is not None else 0,
                        "gemm_overlap_max_tokens": int(envs.VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD),
                        "gemm_overlap": b.index.num_tokens <= int(envs.VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD)},
        "requests": {**b.index.region_counts(), "batch_reordered": b.index.reordered,
                     "builder_split": {kind: _split(g.metadata) for kind, g in groups.items()
                                       if hasattr(g.metadata, "num_decodes")},
                     "swa_split": _split(swa_md)},
        "reorder_batch_threshold": getattr(groups["main"].builder, "reorder_batch_threshold", None)
        if "main" in groups else None,
        "boundaries": boundary_facts(args, b.layout),
        "max_model_len": int(b.config.model_config.max_model_len),
        "max_num_batched_tokens": int(b.config.scheduler_config.max_num_batched_tokens),
        **run_facts(b.config, b.graph, size, mode),
        **graph_record(b.graph is not None, size, b.index.num_tokens, graph_error),
        "flashmla_plan": FLASHMLA_PLAN,
        "synthetic_weights": ("dsv4_weights: projections N(0, 1/in), the block-FP8 ones exact in e4m3 x ue8m0 blocks; "
                              "norms near 1; attn_sink N(0, 1) and ape N(0, 1/4) fp32"),
        "ctx": b.layout.ctx_summary(),
    }
    if "main" in groups and args.compress_ratio == 128:
        width = getattr(groups["main"].builder, "c128a_max_compressed", None)
        meta["c128a_topk_width"] = {"entries": width, "rule": "cdiv(max_model_len, 128) padded to 128: the decode's "
                                    "extra top-k width (topk_length caps the valid ones)"}
    return meta
