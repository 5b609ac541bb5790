"""vLLM's own attention module for a gqa case, its config stand-ins and its weights (imports vLLM).

The module is the one support.module_choice names, built as its model builds it (same constructor
arguments, an HF-style config object where it reads one), on cuda under the case's config: vLLM's
process config (env.py) with this case's CacheConfig (block_size 16, cache_dtype) and a model-config
stand-in that answers what the attention layer, its backend selection and its metadata builder read
(heads, kv heads, head size, dtype). The weights are gqa_weights' bf16 tensors in the projections'
stored form (proj.py: bf16, or e4m3 with block scales), loaded as the checkpoint loader would hand them
over: qkv_proj = [q; k; v], o_proj, the q/k norms (Qwen3-Next's GemmaRMSNorm stores w - 1), then vLLM's
own process_weights_after_loading.
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import torch

from operatorx.backends.torch.attention.gqa import RMS_EPS, GqaWeights
from operatorx.backends.torch.attention.layout import PAGE_TOKENS, Layout
from operatorx.backends.vllm.attention.proj import load_stored, store
from operatorx.backends.vllm.attention.support import CACHE_DTYPE, ModuleChoice
from operatorx.backends.vllm.quant_map import Plan
from operatorx.backends.vllm.weights import load_params
from operatorx.spec.attention import GqaArgs

__all__ = ["ModelConfigStandIn", "case_config", "config_with", "model_stand_in", "make_module", "load_weights",
           "max_position"]


class ModelConfigStandIn(SimpleNamespace):
    """env.py's model-config stand-in plus the attention sizes vLLM's builders ask ModelConfig for
    (FlashAttentionMetadataBuilder: get_num_attention_heads / get_num_kv_heads / get_head_size)."""

    def get_num_attention_heads(self, parallel_config: Any = None) -> int:
        return int(self.num_attention_heads)

    def get_num_kv_heads(self, parallel_config: Any = None) -> int:
        return int(self.num_key_value_heads)

    def get_head_size(self) -> int:
        return int(self.head_dim)


def set_field(obj: Any, name: str, value: Any) -> None:
    """Set a config field, past a validating setter (pydantic) as env.py does."""
    try:
        setattr(obj, name, value)
    except Exception:  # noqa: BLE001 - a validating setter: bypass it
        object.__setattr__(obj, name, value)


def model_stand_in(env_config: Any, heads: int, kv_heads: int, head_size: int, use_mla: bool,
                   **extra: Any) -> ModelConfigStandIn:
    """The process config's model stand-in with one attention layer's sizes (and `extra` fields)."""
    base = dict(vars(env_config.model_config))
    return ModelConfigStandIn(**{
        **base, "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_size,
        "is_moe": False,
        # read by Attention.__init__, fa_utils.get_flash_attn_version, FlashAttentionMetadataBuilder
        "is_mm_prefix_lm": False, "is_diffusion": False, "rswa_window": None, "multimodal_config": None,
        "is_encoder_decoder": False, "use_mla": use_mla, "quantization": None, **extra})


def config_with(env_config: Any, cache: Any, model: Any) -> Any:
    """A shallow copy of the process config (its compilation config, hence its layer registry, shared)
    with the case's cache and model configs."""
    cfg = copy.copy(env_config)
    set_field(cfg, "cache_config", cache)
    set_field(cfg, "model_config", model)
    return cfg


def case_config(env_config: Any, args: GqaArgs) -> tuple[Any, Any, ModelConfigStandIn]:
    """(VllmConfig, CacheConfig, model config) of a gqa case (config_with's copy)."""
    from vllm.config import CacheConfig

    cache = CacheConfig(block_size=PAGE_TOKENS, cache_dtype=CACHE_DTYPE[args.kv_cache_dtype])
    model = model_stand_in(env_config, args.q_heads, args.kv_heads, args.head_dim, use_mla=False)
    return config_with(env_config, cache, model), cache, model


def max_position(layout: Layout) -> int:
    """The rotary table's length: the longest sequence, at least 32768 (a power of two, so cases share
    vLLM's cached rotary modules)."""
    need = max(r.ctx + r.q for r in layout.requests)
    size = 32768
    while size < need:
        size *= 2
    return size


def _rope_parameters(args: GqaArgs) -> dict[str, Any]:
    """The HF config's rope_parameters as get_rope reads them (rotary_embedding/__init__.py)."""
    out: dict[str, Any] = {"rope_type": "default", "rope_theta": args.rope_theta}
    if args.rope_dim != args.head_dim:
        out["partial_rotary_factor"] = args.rope_dim / args.head_dim
    if args.mrope_section is not None:
        out["mrope_section"] = list(args.mrope_section)
        out["mrope_interleaved"] = True           # Qwen3-VL / Qwen3.5 text configs
    return out


def make_module(choice: ModuleChoice, args: GqaArgs, cache_config: Any, prefix: str, positions: int,
                quant_config: Any = None) -> Any:
    """The module, built on the current device (the caller's torch.device) under the current config, its
    projections under `quant_config` (None: bf16)."""
    cls = getattr(importlib.import_module(choice.module), choice.cls)
    rope = _rope_parameters(args)
    if choice.cls == "Qwen3NextAttention":
        config = SimpleNamespace(hidden_size=args.hidden, num_attention_heads=args.q_heads,
                                 num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
                                 max_position_embeddings=positions, rope_parameters=rope,
                                 rms_norm_eps=RMS_EPS, attn_output_gate=True)
        module = cls(config, model_config=None, cache_config=cache_config, quant_config=quant_config, prefix=prefix)
    elif choice.cls == "Qwen3Attention":
        module = cls(hidden_size=args.hidden, num_heads=args.q_heads, num_kv_heads=args.kv_heads,
                     rope_parameters=rope, max_position=positions, head_dim=args.head_dim, rms_norm_eps=RMS_EPS,
                     qkv_bias=False, cache_config=cache_config, quant_config=quant_config, prefix=prefix,
                     per_layer_sliding_window=args.window)
    else:
        from vllm.model_executor.models.utils import extract_layer_index

        config = SimpleNamespace(head_dim=args.head_dim, rope_parameters=rope)
        if args.window is not None:        # LlamaAttention reads layer_types[layer index]
            config.layer_types = ["sliding_attention"] * (extract_layer_index(prefix) + 1)
            config.sliding_window = args.window
        module = cls(config=config, hidden_size=args.hidden, num_heads=args.q_heads, num_kv_heads=args.kv_heads,
                     max_position_embeddings=positions, quant_config=quant_config, bias=False, bias_o_proj=False,
                     cache_config=cache_config, prefix=prefix)
    rotary = module.rotary_emb
    if int(rotary.rotary_dim) != args.rope_dim:
        raise RuntimeError(f"{choice.cls}: vLLM's rotary embedding turns {rotary.rotary_dim} dims, "
                           f"the case rope_dim={args.rope_dim}")
    return module


def _norm_weight(w: torch.Tensor, offset: bool) -> torch.Tensor:
    """The stored norm weight whose effective multiplier is `w` (GemmaRMSNorm: 1 + stored, in fp32)."""
    if not offset:
        return w
    stored = (w.float() - 1).to(w.dtype)
    if not torch.equal(stored.float() + 1, w.float()):      # bf16 near 1: w - 1 is exact
        raise RuntimeError("a q/k norm weight is not exact as GemmaRMSNorm's w - 1 in bf16")
    return stored


def load_weights(module: Any, choice: ModuleChoice, w: GqaWeights, model_config: Any, plan: Plan) -> GqaWeights:
    """Store the weights as the plan's checkpoint would (proj.store: qkv_proj as the one [q; k; v] matrix
    it holds), copy them into the module's parameters, then vLLM's process_weights_after_loading; returns
    the weights as stored (dequantized), which the reference reads."""
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    qkv, o = store(torch.cat([w.q, w.k, w.v]), plan), store(w.o, plan)
    expected = {f"qkv_proj.{n}" for n in qkv.tensors} | {f"o_proj.{n}" for n in o.tensors}
    if w.q_norm is not None:
        expected |= {"q_norm.weight", "k_norm.weight"}
    # under a quant config the Attention layer holds its q/k/v/prob scales too: a checkpoint without them
    # leaves vLLM's defaults (1.0), as these cases' caches assume
    have = {name for name, _ in module.named_parameters() if not name.startswith("attn.")}
    if have != expected:
        raise RuntimeError(f"{choice.cls}: parameters {sorted(have)}, this backend fills {sorted(expected)}")
    load_stored(module.qkv_proj, qkv, f"{choice.cls}.qkv_proj")
    load_stored(module.o_proj, o, f"{choice.cls}.o_proj")
    if w.q_norm is not None and w.k_norm is not None:
        load_params(module.q_norm, {"weight": _norm_weight(w.q_norm, choice.norm_offset)}, f"{choice.cls}.q_norm")
        load_params(module.k_norm, {"weight": _norm_weight(w.k_norm, choice.norm_offset)}, f"{choice.cls}.k_norm")
    process_weights_after_loading(module, model_config, torch.device("cuda"))
    module.requires_grad_(False)
    q, k, v = torch.split(qkv.weight, [w.q.shape[0], w.k.shape[0], w.v.shape[0]])
    return replace(w, q=q, k=k, v=v, o=o.weight)
