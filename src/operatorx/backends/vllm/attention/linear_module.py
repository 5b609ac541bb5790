"""vLLM's linear-attention module for a gdn / kda case: config stand-ins, the module, its weights (imports vLLM).

- config: the process config (module.config_with) with this case's CacheConfig: prefix caching off, so
  mamba_cache_mode "none" (one state block a request); mamba_block_size the layout's block (the longest
  request; serving sets max_model_len); mamba_cache_dtype auto (the conv state in the bf16 model dtype);
  gdn's mamba_ssm_cache_dtype from state_dtype (float32 / bfloat16). The model stand-in answers what the
  modules and the GDN builder read: dtype, hf_text_config.linear_key_head_dim (the GDN prefill backend
  choice), max_model_len.
- module: built as its model builds it (qwen3_5.py's decoder layer: QwenGatedDeltaNetAttention(config,
  vllm_config, prefix, gqa_interleaved_layout=False); kimi_linear.py's: KimiGatedDeltaNetAttention(config,
  vllm_config, prefix)), from an HF-style config with the case's sizes, hidden_act silu and rms_norm_eps
  RMS_EPS (gdn's gated norm eps; Kimi's o_norm keeps its own 1e-5).
- weights: linear_weights' tensors as the checkpoint loader hands them over (gdn: in_proj_qkvz = [qkv; z],
  in_proj_ba = [b; a], Qwen3.5's split order), each into a parameter of its own dtype (refused otherwise,
  so the reference reads what the module holds), then vLLM's process_weights_after_loading.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any, Union

import torch

from operatorx.backends.torch.attention.gqa import RMS_EPS
from operatorx.backends.torch.attention.linear_weights import GdnWeights, KdaWeights, LinearWeights
from operatorx.backends.vllm.attention.linear_support import SSM_CACHE_DTYPE, LinearModule
from operatorx.backends.vllm.attention.module import ModelConfigStandIn, config_with, model_stand_in
from operatorx.backends.vllm.attention.proj import check_parameters
from operatorx.backends.vllm.weights import load_params
from operatorx.spec.attention import GdnArgs, KdaArgs

__all__ = ["GDN_PARAMS", "KDA_PARAMS", "linear_case_config", "make_linear_module", "load_linear_weights"]

GDN_PARAMS = frozenset({"in_proj_qkvz.weight", "in_proj_ba.weight", "conv1d.weight", "dt_bias", "A_log",
                        "norm.weight", "out_proj.weight"})
KDA_PARAMS = frozenset({f"{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "f_a_proj", "f_b_proj", "b_proj",
                                                "g_a_proj", "g_b_proj", "q_conv1d", "k_conv1d", "v_conv1d",
                                                "o_norm", "o_proj")} | {"A_log", "dt_bias"})


def linear_case_config(env_config: Any, args: Union[GdnArgs, KdaArgs],
                       block_tokens: int) -> tuple[Any, Any, ModelConfigStandIn]:
    """(VllmConfig, CacheConfig, model config) of the case (module docstring)."""
    from vllm.config import CacheConfig

    ssm = SSM_CACHE_DTYPE[args.state_dtype] if isinstance(args, GdnArgs) else "auto"
    cache = CacheConfig(enable_prefix_caching=False, mamba_cache_dtype="auto", mamba_ssm_cache_dtype=ssm,
                        mamba_block_size=block_tokens)
    heads = args.v_heads if isinstance(args, GdnArgs) else args.heads
    text = SimpleNamespace(model_type="operatorx", linear_key_head_dim=args.head_dim)
    model = model_stand_in(env_config, heads, heads, args.head_dim, use_mla=False, hf_text_config=text,
                           hf_config=text, max_model_len=block_tokens)
    return config_with(env_config, cache, model), cache, model


def make_linear_module(choice: LinearModule, args: Union[GdnArgs, KdaArgs], config: Any, prefix: str) -> Any:
    """The module on the current device under the current config (module docstring)."""
    cls = getattr(importlib.import_module(choice.module), choice.cls)
    base = {"hidden_size": args.hidden, "hidden_act": "silu", "rms_norm_eps": RMS_EPS}
    if isinstance(args, GdnArgs):
        hf = SimpleNamespace(**base, linear_num_key_heads=args.qk_heads, linear_num_value_heads=args.v_heads,
                             linear_key_head_dim=args.head_dim, linear_value_head_dim=args.head_dim,
                             linear_conv_kernel_dim=args.conv_kernel, output_gate_type=args.norm_act)
        return cls(hf, vllm_config=config, prefix=prefix, gqa_interleaved_layout=False)
    hf = SimpleNamespace(**base, linear_attn_config={"head_dim": args.head_dim, "num_heads": args.heads,
                                                     "short_conv_kernel_size": args.conv_kernel})
    return cls(hf, config, prefix=prefix)


def _load(layer: torch.nn.Module, tensors: dict[str, torch.Tensor], what: str) -> None:
    """load_params, refused when a tensor's dtype is not its parameter's (a silent cast would part the module's
    values from the reference's)."""
    params = dict(layer.named_parameters(recurse=False))
    for name, t in tensors.items():
        p = params.get(name)
        if p is not None and p.dtype != t.dtype:
            raise RuntimeError(f"{what}.{name}: the module holds {p.dtype}, the weights are {t.dtype}")
    load_params(layer, tensors, what)


def _gdn(module: Any, w: GdnWeights, name: str) -> None:
    _load(module.in_proj_qkvz, {"weight": torch.cat([w.qkv, w.z])}, f"{name}.in_proj_qkvz")
    _load(module.in_proj_ba, {"weight": torch.cat([w.b, w.a])}, f"{name}.in_proj_ba")
    _load(module.conv1d, {"weight": w.conv}, f"{name}.conv1d")
    _load(module, {"dt_bias": w.dt_bias, "A_log": w.A_log}, name)
    _load(module.norm, {"weight": w.norm}, f"{name}.norm")
    _load(module.out_proj, {"weight": w.out}, f"{name}.out_proj")


def _kda(module: Any, w: KdaWeights, name: str) -> None:
    for layer, t in (("q_proj", w.q), ("k_proj", w.k), ("v_proj", w.v), ("f_a_proj", w.f_a), ("f_b_proj", w.f_b),
                     ("b_proj", w.b), ("g_a_proj", w.g_a), ("g_b_proj", w.g_b), ("q_conv1d", w.q_conv),
                     ("k_conv1d", w.k_conv), ("v_conv1d", w.v_conv), ("o_norm", w.o_norm), ("o_proj", w.o)):
        _load(getattr(module, layer), {"weight": t}, f"{name}.{layer}")
    _load(module, {"A_log": w.A_log, "dt_bias": w.dt_bias}, name)


def load_linear_weights(module: Any, choice: LinearModule, w: LinearWeights, model_config: Any) -> None:
    """Copy the weights into the module's parameters, then vLLM's process_weights_after_loading."""
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    check_parameters(module, GDN_PARAMS if isinstance(w, GdnWeights) else KDA_PARAMS, choice.cls)
    if isinstance(w, GdnWeights):
        _gdn(module, w, choice.cls)
    else:
        _kda(module, w, choice.cls)
    process_weights_after_loading(module, model_config, torch.device("cuda"))
    module.requires_grad_(False)
