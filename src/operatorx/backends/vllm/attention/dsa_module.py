"""vLLM's DeepseekV2MLAAttention as DeepSeek-V3.2 builds it (is_v32): config stand-ins, the module, its weights
(imports vLLM).

- config: mla_module's (the case's CacheConfig, block size unset so the sparse MLA backend is selected as in
  serving, then set to its preferred one), a scheduler config whose token budget holds the batch, the model
  stand-in's hf_config also carrying index_topk, index_n_heads and index_head_dim: FLASH_ATTN_MLA_SPARSE's
  supports_combination refuses a model without index_topk.
- module: DeepseekV2MLAAttention with an HF-style config that has index_topk (is_v32 = hasattr(config,
  "index_topk")), index_n_heads, index_head_dim and qk_rope_head_dim (what Indexer.__init__ reads), and the
  model's topk_indices_buffer (DeepseekV2Model: int32 [max_num_batched_tokens, index_topk]), which the
  Indexer fills and the sparse MLA backend reads. An own indexer: no index_topk_freq / pattern (every layer
  runs its own). `indexer: reuse`: an index_topk_pattern whose entry at the module's layer index is "S",
  vLLM's IndexCache skip layer: no Indexer is built and the attention reads the buffer as an earlier layer
  left it.
- weights: the MLA ones as mla_module.load_mla_weights stores them (fused_qkv_a_proj = [q_a; kv_a]), plus
  an own indexer's: wq_b under the plan, wk_weights_proj = [wk; weights_proj] in bf16 (vLLM's fused
  unquantized layer), k_norm's weight and bias; then vLLM's process_weights_after_loading.
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import torch

from operatorx.backends.base import Unsupported
from operatorx.backends.torch.attention.dsa import DsaWeights, mla_args
from operatorx.backends.torch.attention.gqa import RMS_EPS
from operatorx.backends.vllm.attention.mla_module import MLA_NORMS, rope_parameters
from operatorx.backends.vllm.attention.module import ModelConfigStandIn, config_with, model_stand_in, set_field
from operatorx.backends.vllm.attention.proj import load_layers, store, stored_names
from operatorx.backends.vllm.attention.support import CACHE_DTYPE, DEEPSEEK_MLA
from operatorx.backends.vllm.quant_map import Plan
from operatorx.backends.vllm.weights import load_params
from operatorx.spec.attention import MlaDsaArgs

__all__ = ["INDEXER_NORMS", "dsa_case_config", "make_dsa_module", "load_dsa_weights"]

#: The indexer's LayerNorm parameters.
INDEXER_NORMS = frozenset({"indexer.k_norm.weight", "indexer.k_norm.bias"})


def _index_fields(args: MlaDsaArgs) -> dict[str, Any]:
    return {"index_topk": args.topk, "index_n_heads": args.index_heads, "index_head_dim": args.index_dim}


def dsa_case_config(env_config: Any, args: MlaDsaArgs, positions: int,
                    tokens: int) -> tuple[Any, Any, ModelConfigStandIn]:
    """(VllmConfig, CacheConfig, model config) of the case (module docstring); the scheduler's token budget
    raised to the batch's new `tokens` where vLLM's default is smaller, as a serving engine that runs this
    batch in one step is configured (it sizes the topk_indices_buffer rows and the indexer's workspaces)."""
    import copy

    from vllm.config import CacheConfig

    cache = CacheConfig(cache_dtype=CACHE_DTYPE[args.kv_cache_dtype])
    dims = SimpleNamespace(model_type="operatorx", q_lora_rank=args.q_lora_rank, kv_lora_rank=args.kv_lora_rank,
                           qk_nope_head_dim=args.nope, qk_rope_head_dim=args.rope_dim, v_head_dim=args.v,
                           **_index_fields(args))
    model = model_stand_in(env_config, args.heads, 1, args.kv_lora_rank + args.rope_dim, use_mla=True,
                           hf_text_config=dims, hf_config=dims, max_model_len=positions)
    config = config_with(env_config, cache, model)
    scheduler = copy.copy(config.scheduler_config)
    if int(scheduler.max_num_batched_tokens) < tokens:
        set_field(scheduler, "max_num_batched_tokens", tokens)
    set_field(config, "scheduler_config", scheduler)
    return config, cache, model


def make_dsa_module(config: Any, args: MlaDsaArgs, cache_config: Any, prefix: str, positions: int, longest: int,
                    topk_indices: torch.Tensor, quant_config: Any = None) -> Any:
    """DeepseekV2MLAAttention on the current device under the current config, with its Indexer or, for
    `indexer: reuse`, as a skip layer (module docstring); refused when it builds an indexer where the case has
    none or none where it has one, or its rotary tables are shorter than the `longest` sequence."""
    from vllm.model_executor.models.utils import extract_layer_index

    cls = getattr(importlib.import_module(DEEPSEEK_MLA.module), DEEPSEEK_MLA.cls)
    reuse = args.indexer == "reuse"
    skip = {"index_topk_pattern": "F" * extract_layer_index(prefix) + "S"} if reuse else {}
    hf = SimpleNamespace(rms_norm_eps=RMS_EPS, rope_parameters=rope_parameters(mla_args(args)),
                         qk_rope_head_dim=args.rope_dim, **_index_fields(args), **skip)
    module = cls(vllm_config=config, config=hf, hidden_size=args.hidden, num_heads=args.heads,
                 qk_nope_head_dim=args.nope, qk_rope_head_dim=args.rope_dim, v_head_dim=args.v,
                 q_lora_rank=args.q_lora_rank, kv_lora_rank=args.kv_lora_rank, max_position_embeddings=positions,
                 cache_config=cache_config, quant_config=quant_config, prefix=prefix, topk_indices_buffer=topk_indices)
    has_indexer = getattr(module, "indexer", None) is not None
    if has_indexer == reuse or bool(getattr(module.mla_attn, "skip_topk", False)) != reuse:
        raise RuntimeError(f"{DEEPSEEK_MLA.cls}: built with indexer {has_indexer}, skip_topk "
                           f"{getattr(module.mla_attn, 'skip_topk', None)} for indexer={args.indexer} "
                           f"(is_v32 {getattr(module, 'is_v32', None)})")
    for rotary in (module.rotary_emb,) if reuse else (module.rotary_emb, module.indexer_rope_emb):
        if int(rotary.rotary_dim) != args.rope_dim:
            raise RuntimeError(f"{DEEPSEEK_MLA.cls}: a rotary embedding turns {rotary.rotary_dim} dims, the case "
                               f"rope_dim={args.rope_dim}")
        table = getattr(rotary, "cos_sin_cache", None)
        if table is not None and int(table.shape[0]) < longest:
            raise Unsupported(f"rope: vLLM's {type(rotary).__name__} tables {int(table.shape[0])} positions; the "
                              f"batch reaches {longest}")
    if not reuse and module.indexer_rope_emb.is_neox_style is not True:
        raise RuntimeError(f"{DEEPSEEK_MLA.cls}: the indexer's RoPE is not neox-paired, which the reference assumes")
    return module


def load_dsa_weights(module: Any, w: DsaWeights, model_config: Any, plan: Plan) -> DsaWeights:
    """Store and copy the weights (module docstring), then process_weights_after_loading; returns them as stored
    (dequantized), which the reference reads."""
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    name, m = DEEPSEEK_MLA.cls, w.mla
    own = module.indexer is not None
    stored = {"fused_qkv_a_proj": store(torch.cat([m.q_a, m.kv_a]), plan), "q_b_proj": store(m.q_b, plan),
              "kv_b_proj": store(m.kv_b, plan), "o_proj": store(m.o, plan)}
    if own:
        stored["indexer.wq_b"] = store(w.wq_b, plan)
    indexer_names = INDEXER_NORMS | {"indexer.wk_weights_proj.weight"} if own else frozenset()
    load_layers(module, stored, stored_names(stored) | MLA_NORMS | indexer_names, name)
    load_params(module.q_a_layernorm, {"weight": m.q_a_norm}, f"{name}.q_a_layernorm")
    load_params(module.kv_a_layernorm, {"weight": m.kv_a_norm}, f"{name}.kv_a_layernorm")
    if own:
        load_params(module.indexer.wk_weights_proj, {"weight": torch.cat([w.wk, w.weights_proj])},
                    f"{name}.indexer.wk_weights_proj")
        load_params(module.indexer.k_norm, {"weight": w.k_norm, "bias": w.k_norm_bias}, f"{name}.indexer.k_norm")
    process_weights_after_loading(module, model_config, torch.device("cuda"))
    module.requires_grad_(False)
    q_a, kv_a = torch.split(stored["fused_qkv_a_proj"].weight, [m.q_a.shape[0], m.kv_a.shape[0]])
    mla = replace(m, q_a=q_a, kv_a=kv_a, q_b=stored["q_b_proj"].weight, kv_b=stored["kv_b_proj"].weight,
                  o=stored["o_proj"].weight)
    return replace(w, mla=mla, wq_b=stored["indexer.wq_b"].weight if own else w.wq_b)
