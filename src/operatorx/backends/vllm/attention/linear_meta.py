"""What a vllm gdn / kda row records about the module it timed (imports vLLM; called from linear_build.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

from operatorx.backends.vllm.attention.build import graph_notes
from operatorx.backends.vllm.attention.run_facts import run_facts
from operatorx.backends.vllm.common import class_name
from operatorx.spec.attention import GdnArgs, KdaArgs

if TYPE_CHECKING:
    from operatorx.backends.vllm.attention.linear_build import BuiltLinear

__all__ = ["linear_metadata", "split_of", "kernels_of"]

_SPLIT = ("num_decodes", "num_prefills", "num_decode_tokens", "num_prefill_tokens", "num_spec_decodes",
          "num_actual_tokens")


def split_of(md: Any) -> dict[str, Any]:
    """The builder's decode/prefill split and how many prefills start from a state: the prefills' own
    flags (prefill_has_initial_state); has_initial_state flags every sequence, decodes too."""
    out: dict[str, Any] = {k: getattr(md, k, None) for k in _SPLIT}
    has = getattr(md, "prefill_has_initial_state", None)
    out["prefills_with_initial_state"] = None if has is None else int(has.sum().item())
    return out


def kernels_of(args: Union[GdnArgs, KdaArgs], module: Any, md: Any) -> dict[str, Any]:
    """The kernels the forward's paths call, as the module chooses them for this batch."""
    decode, prefill = md.num_decodes > 0, md.num_prefills > 0
    if isinstance(args, GdnArgs):
        packed = bool(getattr(module, "enable_packed_recurrent_decode", False)) and not prefill
        return {"conv": ("causal_conv1d_fn" if prefill else "causal_conv1d_update"),
                "decode": (None if not decode else "fused_recurrent_gated_delta_rule_packed_decode" if packed
                           else "fused_sigmoid_gating_delta_rule_update"),
                "prefill": (None if not prefill else
                            f"fused_post_conv_prep + chunk_gated_delta_rule ({module.gdn_prefill_backend})"),
                "gdn_prefill_backend": getattr(module, "gdn_prefill_backend", None),
                "packed_recurrent_decode": getattr(module, "enable_packed_recurrent_decode", None),
                "norm": class_name(module.norm)}
    return {"conv": "causal_conv1d_fn" if prefill else "causal_conv1d_update",
            "delta_rule": "chunk_kda_with_fused_gate" if prefill else "fused_kda_gate + fused_recurrent_kda",
            "norm": class_name(module.o_norm)}


def linear_metadata(args: Union[GdnArgs, KdaArgs], b: BuiltLinear, backend: Any, builder: Any, spec: Any,
                    size: Optional[int], mode: str, graph_error: Optional[str]) -> dict[str, Any]:
    from operatorx.backends.vllm.env import vllm_version

    md = b.attn_metadata
    meta: dict[str, Any] = {
        "framework": f"vllm {vllm_version()}",
        "module": b.choice.path,
        "layout": "Qwen3.5 (gqa_interleaved_layout=False)" if isinstance(args, GdnArgs) else "Kimi Linear",
        "layer": b.layer_name,
        "attention_backend": {"name": backend.get_name(), "class": backend.__name__,
                              "mamba_type": str(getattr(b.module, "mamba_type", None))},
        "metadata_builder": type(builder).__name__,
        "metadata": class_name(md),
        "reorder_batch_threshold": getattr(builder, "reorder_batch_threshold", None),
        "kernels": kernels_of(args, b.module, md),
        "state": {"spec": class_name(spec), "shapes": [list(s) for s in spec.shapes],
                  "dtypes": [str(d).replace("torch.", "") for d in spec.dtypes],
                  "tensors": [{"shape": list(t.shape), "stride": list(t.stride()),
                               "dtype": str(t.dtype).replace("torch.", "")} for t in b.states],
                  "conv_layout": "DS (dim, width-1)" if b.conv_dim_first else "SD (width-1, dim)",
                  "page_size_bytes": int(spec.page_size_bytes), "page_size_padded": spec.page_size_padded,
                  "block_size": spec.block_size, "num_blocks": b.index.num_blocks,
                  "mamba_cache_mode": spec.mamba_cache_mode, "reserved_blocks": "block 0 (vLLM's null block)",
                  "slots": b.layout.pages, "filled": "random format-valid states for requests with ctx > 0; "
                  "zeros otherwise (as the runner zeroes new blocks)",
                  "bytes": int(b.raw.numel())},
        "requests": {**b.index.region_counts(), "batch_reordered": b.index.reordered, "builder_split": split_of(md)},
        **run_facts(b.config, b.graph, size, mode),
        "synthetic_weights": "random bf16 N(0, 1/in) projections, A in [1, 16], dt in [1e-3, 1e-1] (linear_weights)",
        "ctx": b.layout.ctx_summary(),
        "not_modelled": "a hybrid model pads the mamba page to its attention page (page_size_padded) and, with "
                        "prefix caching on, runs mamba_cache_mode align; here the page is unpadded and the mode none",
    }
    return graph_notes(meta, b.graph, size, b.index.num_tokens, graph_error)
