"""vLLM's DeepseekV2MLAAttention for an mla case: its config stand-ins, the module and its weights (imports vLLM).

- config: the process config (module.config_with) with this case's CacheConfig and a model-config
  stand-in. The CacheConfig leaves block_size unset (vLLM's default 16, `user_specified_block_size`
  False), so the MLA backend is selected unconstrained as in serving; `set_block_size` then sets the
  selected backend's get_preferred_block_size(16), as Platform.update_block_size_for_backend does
  (platforms/interface.py). The stand-in answers what MLAAttention, the MLA backend and prefill
  selection, get_mla_dims and the MLA metadata builders read: heads, one KV head, head size
  kv_lora_rank + rope_dim, hf_text_config's MLA dims, max_model_len (the chunked-prefill workspace).
- module: DeepseekV2MLAAttention built as DeepseekV2DecoderLayer builds it, with an HF-style config
  (rms_norm_eps, rope_parameters: "default", or "yarn" with its fields, which the module itself turns
  into "deepseek_yarn" and the mscale² softmax factor).
- weights: mla_weights' bf16 tensors as the checkpoint loader hands them over: fused_qkv_a_proj =
  [q_a_proj; kv_a_proj_with_mqa] (rows q_lora_rank then kv_lora_rank + rope_dim, the module's split
  order), q_a_layernorm / kv_a_layernorm (plain RMSNorm x · w, so the weight as is), q_b_proj,
  kv_b_proj, o_proj; then vLLM's process_weights_after_loading, which splits kv_b_proj into
  MLAAttention's W_UK_T / W_UV for the absorbed decode path.
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import torch

from operatorx.backends.base import Unsupported
from operatorx.backends.torch.attention.gqa import RMS_EPS
from operatorx.backends.torch.attention.mla import MlaWeights
from operatorx.backends.vllm.attention.module import ModelConfigStandIn, config_with, model_stand_in
from operatorx.backends.vllm.attention.proj import load_layers, store, stored_names
from operatorx.backends.vllm.attention.support import CACHE_DTYPE, DEEPSEEK_MLA
from operatorx.backends.vllm.quant_map import Plan
from operatorx.backends.vllm.weights import load_params
from operatorx.spec.attention import MlaArgs

__all__ = ["MLA_PARAMS", "MLA_NORMS", "mla_case_config", "set_block_size", "rope_parameters", "make_mla_module",
           "load_mla_weights"]

#: The module's norm parameters (its projections' parameters follow the plan: proj.store).
MLA_NORMS = frozenset({"q_a_layernorm.weight", "kv_a_layernorm.weight"})
#: The module's own parameters with bf16 projections, before process_weights_after_loading (q_lora_rank set).
MLA_PARAMS = MLA_NORMS | {"fused_qkv_a_proj.weight", "q_b_proj.weight", "kv_b_proj.weight", "o_proj.weight"}


def mla_case_config(env_config: Any, args: MlaArgs, positions: int) -> tuple[Any, Any, ModelConfigStandIn]:
    """(VllmConfig, CacheConfig, model config) of the case (module docstring)."""
    from vllm.config import CacheConfig

    cache = CacheConfig(cache_dtype=CACHE_DTYPE[args.kv_cache_dtype])
    dims = SimpleNamespace(model_type="operatorx", q_lora_rank=args.q_lora_rank, kv_lora_rank=args.kv_lora_rank,
                           qk_nope_head_dim=args.nope, qk_rope_head_dim=args.rope_dim, v_head_dim=args.v)
    model = model_stand_in(env_config, args.heads, 1, args.kv_lora_rank + args.rope_dim, use_mla=True,
                           hf_text_config=dims, hf_config=dims, max_model_len=positions)
    return config_with(env_config, cache, model), cache, model


def set_block_size(config: Any, backend: Any) -> int:
    """The selected backend's preferred block size for vLLM's default (16), set on the case's cache config."""
    from vllm.config import CacheConfig, set_current_vllm_config

    with set_current_vllm_config(config):
        size = int(backend.get_preferred_block_size(CacheConfig.DEFAULT_BLOCK_SIZE))
    config.cache_config.block_size = size
    return size


def rope_parameters(args: MlaArgs) -> dict[str, Any]:
    """The HF config's rope_parameters (get_rope's keys); YaRN's optional fields only where the case sets them,
    so vLLM's defaults (beta_fast 32, beta_slow 1, mscale 1, mscale_all_dim 0) apply as the torch rope's do."""
    out: dict[str, Any] = {"rope_type": "default", "rope_theta": args.rope_theta}
    s = args.rope_scaling
    if s is not None:
        out.update({"rope_type": "yarn", "factor": s.factor, "original_max_position_embeddings": s.original_max})
        for key in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
            value = getattr(s, key)
            if value is not None:
                out[key] = value
    return out


def make_mla_module(config: Any, args: MlaArgs, cache_config: Any, prefix: str, positions: int,
                    longest: int, quant_config: Any = None) -> Any:
    """DeepseekV2MLAAttention on the current device under the current config; refused when its rotary table
    is shorter than the `longest` sequence of the batch (YaRN tables original_max · factor positions)."""
    cls = getattr(importlib.import_module(DEEPSEEK_MLA.module), DEEPSEEK_MLA.cls)
    hf = SimpleNamespace(rms_norm_eps=RMS_EPS, rope_parameters=rope_parameters(args))
    module = cls(vllm_config=config, config=hf, hidden_size=args.hidden, num_heads=args.heads,
                 qk_nope_head_dim=args.nope, qk_rope_head_dim=args.rope_dim, v_head_dim=args.v,
                 q_lora_rank=args.q_lora_rank, kv_lora_rank=args.kv_lora_rank, max_position_embeddings=positions,
                 cache_config=cache_config, quant_config=quant_config, prefix=prefix)
    rotary = module.rotary_emb
    if int(rotary.rotary_dim) != args.rope_dim:
        raise RuntimeError(f"{DEEPSEEK_MLA.cls}: vLLM's rotary embedding turns {rotary.rotary_dim} dims, "
                           f"the case rope_dim={args.rope_dim}")
    table = getattr(rotary, "cos_sin_cache", None)
    if table is not None and int(table.shape[0]) < longest:
        raise Unsupported(f"rope: vLLM's {type(rotary).__name__} tables {int(table.shape[0])} positions; the batch "
                          f"reaches {longest}")
    return module


def load_mla_weights(module: Any, w: MlaWeights, model_config: Any, plan: Plan) -> MlaWeights:
    """Store the weights as the plan's checkpoint would (proj.store; fused_qkv_a_proj as the one
    [q_a; kv_a] matrix it holds), copy them into the module's parameters, then vLLM's
    process_weights_after_loading; returns the weights as stored (dequantized), which the reference reads."""
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    name = DEEPSEEK_MLA.cls
    stored = {"fused_qkv_a_proj": store(torch.cat([w.q_a, w.kv_a]), plan), "q_b_proj": store(w.q_b, plan),
              "kv_b_proj": store(w.kv_b, plan), "o_proj": store(w.o, plan)}
    load_layers(module, stored, stored_names(stored) | MLA_NORMS, name)
    load_params(module.q_a_layernorm, {"weight": w.q_a_norm}, f"{name}.q_a_layernorm")
    load_params(module.kv_a_layernorm, {"weight": w.kv_a_norm}, f"{name}.kv_a_layernorm")
    process_weights_after_loading(module, model_config, torch.device("cuda"))
    module.requires_grad_(False)
    q_a, kv_a = torch.split(stored["fused_qkv_a_proj"].weight, [w.q_a.shape[0], w.kv_a.shape[0]])
    return replace(w, q_a=q_a, kv_a=kv_a, q_b=stored["q_b_proj"].weight, kv_b=stored["kv_b_proj"].weight,
                   o=stored["o_proj"].weight)
