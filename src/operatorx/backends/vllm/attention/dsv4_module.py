"""vLLM's DeepseekV4FlashMLAAttention for a dsv4_attn case: its config stand-ins, the module and its weights
(imports vLLM inside the functions).

- config: the process config (module.config_with) with
  - a CacheConfig of cache_dtype "fp8", block size 256: the layer asserts an fp8 cache and rewrites it to
    fp8_ds_mla on this same object (attention.py:81-92), and 256 is the kernel block of FLASHMLA_SPARSE_DSV4
    and the V4 indexer (sparse_mla.py:53-54, indexer.py:170-171);
  - a model stand-in whose hf_config is DeepSeek-V4's (model_type deepseek_v4) with the fields the layer,
    its compressor, indexer, rope and builders read (docs/dsv4-attention.md §1): the layer takes its ratio
    from compress_ratios[extract_layer_index(prefix)] when that index is below num_hidden_layers, else 1
    (attention.py:187-190), so both are sized by the layer number our prefix carries;
  - a fresh rope_parameters dict per build (build_deepseek_v4_rope mutates it, common/rope.py:17-30): always
    yarn, so get_rope builds DeepseekV4ScalingRotaryEmbedding with its fp32 table that the fused kernels
    read; without the case's rope_scaling, yarn at factor 1 over the batch's positions is plain RoPE;
  - the scheduler's token budget raised to the batch's new tokens where smaller (it sizes the
    topk_indices_buffer rows and every builder's buffers), max_num_seqs to its requests, and an
    attention config with use_fp4_indexer_cache False (the MXFP4 index cache is sm_10x only);
  - the quant config on the VllmConfig itself: the layer reads vllm_config.quant_config (attention.py:166).
- module: the class _select_dsv4_attn_cls picks on sm90 (nvidia/model.py:760-791), built as
  DeepseekV4DecoderLayer builds it: prefix `<layer>.attn`, the model's shared topk_indices_buffer
  (int32 [max_num_batched_tokens, index_topk], read even by window-only prefills, flashmla.py:276-279) and
  three aux streams (DeepseekV4Model makes three, model.py:984-988; None would run the overlapped GEMMs,
  the indexer and the compressor serially, execute_in_parallel's fallback: safe, but not what serving times).
- weights: Dsv4Weights in the checkpoint's stored form (proj.store under the projection plan):
  fused_wqa_wkv = [wq_a; wkv] (the loader's shards 0/1), wq_b, wo_a, wo_b, indexer.wq_b block FP8;
  compressor / indexer.compressor fused_wkv_wgate = [wkv; wgate] and indexer.weights_proj bf16
  (quant_config=None); ape and attn_sink fp32 (the sink into its first `heads` slots, the rest stay -inf as
  the model's loader leaves them, model.py:1232-1239); norms as the layer holds them; then vLLM's
  process_weights_after_loading, whose DeepGEMM block-FP8 kernel turns wo_a into the 3-D [o_groups,
  o_lora_rank, heads·head_dim/o_groups] weight the o_proj einsum reads (fp8_utils.py:1116-1131).
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, Optional

import torch

from operatorx.backends.base import Unsupported
from operatorx.backends.torch.attention.dsv4 import DSV4_NORM_EPS, CompressorWeights, Dsv4Weights
from operatorx.backends.vllm.attention.module import ModelConfigStandIn, config_with, model_stand_in, set_field
from operatorx.backends.vllm.attention.proj import StoredLayer, load_layers, store, stored_names
from operatorx.backends.vllm.attention.support import ModuleChoice
from operatorx.backends.vllm.quant_map import Plan
from operatorx.backends.vllm.weights import load_params
from operatorx.spec.attention import Dsv4AttnArgs

__all__ = ["DSV4_ATTENTION", "DSV4_BLOCK_SIZE", "DSV4_CACHE_DTYPE", "AUX_STREAMS", "UNUSED_INDEX_TOPK",
           "FP8_LAYERS", "dsv4_rope_parameters", "dsv4_hf_config", "dsv4_case_config", "make_dsv4_module",
           "check_dsv4_module", "load_dsv4_weights", "expected_parameters", "effective_ratio", "expert_dtype_of"]

#: The class vLLM 0.26 builds for DeepSeek-V4 attention on sm90 with no attention backend set.
DSV4_ATTENTION = ModuleChoice("vllm.models.deepseek_v4.nvidia.flashmla", "DeepseekV4FlashMLAAttention", False)
#: The logical block size every DeepSeek-V4 cache group is sized by (compressed caches store 256 // ratio).
DSV4_BLOCK_SIZE = 256
#: CacheConfig.cache_dtype for every dsv4_attn cache dtype this backend runs (auto, fp8, fp8_ds_mla): the
#: layer rewrites fp8 to fp8_ds_mla itself, as `--kv-cache-dtype fp8` does in serving.
DSV4_CACHE_DTYPE = "fp8"
#: Aux CUDA streams the model hands every attention layer.
AUX_STREAMS = 3
#: index_topk of a case without an indexer: it only sizes the model's shared topk_indices_buffer, which a
#: layer without an indexer never reads (any positive width; DeepSeek-V4-Flash's).
UNUSED_INDEX_TOPK = 512
#: The module's block-FP8 layers (DeepseekV4FP8Config): the fused wq_a/wkv, wq_b, wo_a, wo_b; indexer.wq_b at 4.
FP8_LAYERS = ("fused_wqa_wkv", "wq_b", "wo_a", "wo_b")


def effective_ratio(args: Dsv4AttnArgs) -> int:
    """The layer's compress_ratio as vLLM holds it: max(1, ratio) (attention.py:188)."""
    return max(1, args.compress_ratio)


def dsv4_rope_parameters(args: Dsv4AttnArgs, positions: int) -> dict[str, Any]:
    """A fresh rope_parameters dict (module docstring): the case's yarn, or yarn at factor 1 over `positions`.
    vLLM sets rope_theta (compress_rope_theta on a compressed layer), rope_type deepseek_yarn and mscale /
    mscale_all_dim 0 itself (common/rope.py:17-29)."""
    s = args.rope_scaling
    if s is None:
        return {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": positions}
    out: dict[str, Any] = {"rope_type": "yarn", "factor": float(s.factor),
                           "original_max_position_embeddings": s.original_max}
    for key in ("beta_fast", "beta_slow"):
        value = getattr(s, key)
        if value is not None:
            out[key] = value
    return out


def dsv4_hf_config(args: Dsv4AttnArgs, layer: int, positions: int, expert_dtype: str = "fp4") -> SimpleNamespace:
    """DeepSeek-V4's hf_config as the layer and its parts read it (docs/dsv4-attention.md §1), layer `layer`
    being the case's (compress_ratios[layer] = the case's ratio); `expert_dtype` picks the linear layers' block
    scale dtype in DeepseekV4FP8Config (fp4: ue8m0, fp8: fp32; quant_config.py:57-84)."""
    return SimpleNamespace(
        model_type="deepseek_v4", architectures=["DeepseekV4ForCausalLM"],
        hidden_size=args.hidden, num_attention_heads=args.heads, num_key_value_heads=1,
        q_lora_rank=args.q_lora_rank, o_lora_rank=args.o_lora_rank, o_groups=args.o_groups,
        head_dim=args.head_dim, qk_rope_head_dim=args.rope_dim, sliding_window=args.window,
        num_hidden_layers=layer + 1, compress_ratios=[args.compress_ratio] * (layer + 1),
        rms_norm_eps=DSV4_NORM_EPS, max_position_embeddings=positions,
        rope_theta=args.rope_theta, compress_rope_theta=args.compress_rope_theta,
        rope_parameters=dsv4_rope_parameters(args, positions),
        index_topk=args.topk if args.topk is not None else UNUSED_INDEX_TOPK,
        index_n_heads=args.index_heads, index_head_dim=args.index_dim,
        expert_dtype=expert_dtype)


def _layer_number(prefix: str) -> int:
    from vllm.model_executor.models.utils import extract_layer_index

    return int(extract_layer_index(prefix))


def expert_dtype_of(plan: Plan) -> str:
    """The hf_config expert_dtype whose DeepseekV4FP8Config registers the plan's weight-scale dtype."""
    return "fp4" if plan.weight_scale_dtype == "ue8m0" else "fp8"


def dsv4_case_config(env_config: Any, args: Dsv4AttnArgs, prefix: str, positions: int, tokens: int,
                     requests: int, plan: Plan, quant_config: Any) -> tuple[Any, Any, ModelConfigStandIn]:
    """(VllmConfig, CacheConfig, model config) of the case (module docstring)."""
    from vllm.config import CacheConfig

    cache = CacheConfig(cache_dtype=DSV4_CACHE_DTYPE, block_size=DSV4_BLOCK_SIZE)
    hf = dsv4_hf_config(args, _layer_number(prefix), positions, expert_dtype_of(plan))
    model = model_stand_in(env_config, args.heads, 1, args.head_dim, use_mla=True, hf_text_config=hf, hf_config=hf,
                           max_model_len=positions)
    config = config_with(env_config, cache, model)
    scheduler = copy.copy(config.scheduler_config)
    if int(scheduler.max_num_batched_tokens) < tokens:
        set_field(scheduler, "max_num_batched_tokens", tokens)
    if int(scheduler.max_num_seqs) < requests:
        set_field(scheduler, "max_num_seqs", requests)
    set_field(config, "scheduler_config", scheduler)
    attention = copy.copy(config.attention_config)
    set_field(attention, "use_fp4_indexer_cache", False)
    set_field(config, "attention_config", attention)
    set_field(config, "quant_config", quant_config)
    return config, cache, model


def make_dsv4_module(config: Any, prefix: str, topk_indices: torch.Tensor,
                     aux_streams: Optional[list[Any]]) -> Any:
    """DeepseekV4FlashMLAAttention on the current device under the current config (module docstring)."""
    cls = getattr(importlib.import_module(DSV4_ATTENTION.module), DSV4_ATTENTION.cls)
    return cls(config, prefix=prefix, topk_indices_buffer=topk_indices, aux_stream_list=aux_streams)


def check_dsv4_module(module: Any, args: Dsv4AttnArgs, prefix: str, longest: int) -> None:
    """What the build relies on: the layer's ratio, its compressor and indexer, its fp8_ds_mla cache, its
    GPT-J fp32 rope table long enough for the batch, its padded heads; RuntimeError (a vLLM change) or
    Unsupported (a case the table cannot hold) otherwise."""
    name, r = DSV4_ATTENTION.cls, effective_ratio(args)
    if int(module.compress_ratio) != r:
        raise RuntimeError(f"{name}: compress_ratio {module.compress_ratio}, the case's is {r} (layer index of "
                           f"{prefix!r} beyond num_hidden_layers?)")
    if (module.compressor is not None) != (r > 1) or (module.indexer is not None) != (r == 4):
        raise RuntimeError(f"{name}: compressor {module.compressor is not None}, indexer {module.indexer is not None}"
                           f" at ratio {r}")
    if module.kv_cache_dtype != "fp8_ds_mla" or module.kv_cache_torch_dtype != torch.uint8:
        raise RuntimeError(f"{name}: kv cache {module.kv_cache_dtype} {module.kv_cache_torch_dtype}, not fp8_ds_mla")
    if module.prefix != prefix or module.swa_cache_layer.prefix != f"{prefix}.swa_cache":
        raise RuntimeError(f"{name}: layers {module.prefix!r} / {module.swa_cache_layer.prefix!r} for {prefix!r}")
    rotary = module.rotary_emb
    table = rotary.cos_sin_cache
    if table.dtype != torch.float32 or not table.is_cuda or int(table.shape[-1]) != args.rope_dim:
        raise RuntimeError(f"{name}: {type(rotary).__name__}.cos_sin_cache {table.dtype} {list(table.shape)} on "
                           f"{table.device}; the fused insert reads an fp32 [positions, rope_dim] table on the GPU")
    if bool(rotary.is_neox_style):
        raise RuntimeError(f"{name}: its rope is neox-paired; DeepSeek-V4 (and the reference) rotate GPT-J pairs")
    if int(table.shape[0]) < longest:
        raise Unsupported(f"rope: vLLM's {type(rotary).__name__} tables {int(table.shape[0])} positions "
                          f"(original_max x factor); the batch reaches {longest}")
    if int(module.padded_heads) not in (64, 128) or int(module.padded_heads) < args.heads:
        raise RuntimeError(f"{name}: padded heads {module.padded_heads} for {args.heads}")


def _compressor_fused(c: CompressorWeights) -> torch.Tensor:
    return torch.cat([c.wkv, c.wgate])


def _stored_layers(w: Dsv4Weights, plan: Plan) -> dict[str, StoredLayer]:
    stored = {"fused_wqa_wkv": store(torch.cat([w.wq_a, w.wkv]), plan), "wq_b": store(w.wq_b, plan),
              "wo_a": store(w.wo_a, plan), "wo_b": store(w.wo_b, plan)}
    if w.indexer is not None:
        stored["indexer.wq_b"] = store(w.indexer.wq_b, plan)
    return stored


def expected_parameters(w: Dsv4Weights, stored: dict[str, StoredLayer]) -> set[str]:
    """The module's parameter names before process_weights_after_loading (the stored layers' tensors, the
    norms, the sink; a compressor's ape, fused_wkv_wgate and norm; the indexer's weights_proj)."""
    names = stored_names(stored) | {"q_norm.weight", "kv_norm.weight", "attn_sink"}
    compressors = ["compressor"] if w.compressor is not None else []
    if w.indexer is not None:
        compressors.append("indexer.compressor")
        names.add("indexer.weights_proj.weight")
    for c in compressors:
        names |= {f"{c}.ape", f"{c}.fused_wkv_wgate.weight", f"{c}.norm.weight"}
    return names


def _load_compressor(module: Any, c: CompressorWeights, what: str) -> None:
    load_params(module, {"ape": c.ape}, what)
    load_params(module.fused_wkv_wgate, {"weight": _compressor_fused(c)}, f"{what}.fused_wkv_wgate")
    load_params(module.norm, {"weight": c.norm}, f"{what}.norm")


def load_dsv4_weights(module: Any, w: Dsv4Weights, model_config: Any, plan: Plan) -> Dsv4Weights:
    """Store and copy the weights (module docstring), then process_weights_after_loading; returns them as
    stored (dequantized), which the reference reads. RuntimeError when the parameters are not the expected
    ones or wo_a did not become DeepGEMM's 3-D weight."""
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    name = DSV4_ATTENTION.cls
    if (w.compressor is None) != (module.compressor is None) or (w.indexer is None) != (module.indexer is None):
        raise RuntimeError(f"{name}: the weights' compressor / indexer do not match the module's")
    stored = _stored_layers(w, plan)
    load_layers(module, stored, expected_parameters(w, stored), name)
    load_params(module.q_norm, {"weight": w.q_norm}, f"{name}.q_norm")
    load_params(module.kv_norm, {"weight": w.kv_norm}, f"{name}.kv_norm")
    sink = module.attn_sink
    if sink.dtype != torch.float32 or int(sink.shape[0]) < _heads(w):
        raise RuntimeError(f"{name}.attn_sink: {sink.dtype} {list(sink.shape)} for {_heads(w)} heads")
    with torch.no_grad():
        sink[:_heads(w)].copy_(w.attn_sink.to(sink.device))
    if w.compressor is not None:
        _load_compressor(module.compressor, w.compressor, f"{name}.compressor")
    if w.indexer is not None:
        load_params(module.indexer.weights_proj, {"weight": w.indexer.weights_proj}, f"{name}.indexer.weights_proj")
        _load_compressor(module.indexer.compressor, w.indexer.compressor, f"{name}.indexer.compressor")
    process_weights_after_loading(module, model_config, torch.device("cuda"))
    module.requires_grad_(False)
    if module.wo_a.weight.dim() != 3 or not hasattr(module.wo_a, "weight_scale_inv"):
        raise RuntimeError(f"{name}.wo_a: weight {list(module.wo_a.weight.shape)} after process_weights_after_loading;"
                           " o_proj's DeepGEMM einsum reads a 3-D [o_groups, o_lora_rank, in] weight and its "
                           "weight_scale_inv (is DeepGEMM off?)")
    wq_a, wkv = torch.split(stored["fused_wqa_wkv"].weight, [w.wq_a.shape[0], w.wkv.shape[0]])
    out = replace(w, wq_a=wq_a, wkv=wkv, wq_b=stored["wq_b"].weight, wo_a=stored["wo_a"].weight,
                  wo_b=stored["wo_b"].weight)
    if w.indexer is not None:
        out = replace(out, indexer=replace(w.indexer, wq_b=stored["indexer.wq_b"].weight))
    return out


def _heads(w: Dsv4Weights) -> int:
    """The heads the weights hold (attn_sink's length)."""
    return int(w.attn_sink.shape[0])
