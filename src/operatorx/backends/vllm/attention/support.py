"""Can the vllm gqa backend run this case, and which of vLLM 0.26's model modules is it? No vLLM import.

The rule: a gqa case runs as the attention module of the vLLM model that has its form, built alone:
- `gate` (sigmoid output gate packed in q_proj): Qwen3-Next's / Qwen3.5's `Qwen3NextAttention`, which
  always has q/k norm and no sliding window, so gate without qk_norm and gate with a window are refused;
- `qk_norm`: Qwen3's `Qwen3Attention` (a window through its `per_layer_sliding_window`);
- neither: Llama's `LlamaAttention` (a window through the config's `layer_types` / `sliding_window`).
M-RoPE (`mrope_section`) goes through each module's `get_rope` (vLLM's `MRotaryEmbedding`).
An mla case runs as DeepSeek-V2/V3's `DeepseekV2MLAAttention` (q_lora_rank is always set in the spec:
its fused_qkv_a_proj path); `mla_refusal` names what that module or this backend cannot do.
Refused, never emulated: quantized projections (not wired here yet), a split over ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from operatorx.spec.attention import AttentionArgs, GqaArgs, MlaArgs
from operatorx.spec.op_type import OpArgs

__all__ = ["ModuleChoice", "module_choice", "refusal", "mla_refusal", "CACHE_DTYPE", "MULTI_RANK", "DEEPSEEK_MLA"]

MULTI_RANK = "multi-rank vLLM attention is not built"
#: `kv_cache_dtype` -> vLLM's CacheConfig.cache_dtype (config/cache.py CacheDType).
CACHE_DTYPE = {"auto": "auto", "bf16": "bfloat16", "fp8": "fp8"}


@dataclass(frozen=True)
class ModuleChoice:
    """The vLLM module class that builds the case: `module` is its import path, `cls` its name."""

    module: str
    cls: str
    norm_offset: bool
    """True when its q/k norms store w - 1 (GemmaRMSNorm: x · (1 + w)), as Qwen3-Next's do."""

    @property
    def path(self) -> str:
        return f"{self.module}.{self.cls}"


_QWEN3_NEXT = ModuleChoice("vllm.model_executor.models.qwen3_next", "Qwen3NextAttention", True)
_QWEN3 = ModuleChoice("vllm.model_executor.models.qwen3", "Qwen3Attention", False)
_LLAMA = ModuleChoice("vllm.model_executor.models.llama", "LlamaAttention", False)
#: The mla module: its RMSNorms (q_a_layernorm, kv_a_layernorm) are plain x · w.
DEEPSEEK_MLA = ModuleChoice("vllm.model_executor.models.deepseek_v2", "DeepseekV2MLAAttention", False)


def module_choice(args: GqaArgs) -> Union[ModuleChoice, str]:
    """The module of the case's form (module docstring), or the reason none fits."""
    if args.gate:
        if not args.qk_norm:
            return ("gate without qk_norm: vLLM's gated attention (Qwen3NextAttention, Qwen3-Next / Qwen3.5) "
                    "always applies q/k RMSNorm; no vLLM module has the gate alone")
        if args.window is not None:
            return ("gate with window: vLLM's gated attention (Qwen3NextAttention) has no sliding window")
        return _QWEN3_NEXT
    return _QWEN3 if args.qk_norm else _LLAMA


def _projections(args: AttentionArgs) -> Optional[str]:
    for name, pair in (args.proj or {}).items():
        for side, op in (("a", pair.a), ("b", pair.b)):
            if op.dtype != "bf16" or op.arrives_as(activation=side == "a") != "bf16":
                return f"proj.{name}: quantized attention projections are not wired into the vLLM attention " \
                       "backend yet"
    return None


def refusal(args: OpArgs) -> Optional[str]:
    """None when the vllm gqa backend can build the case (vLLM and the device aside); else why, by field."""
    if not isinstance(args, GqaArgs):
        return f"{getattr(args, 'TYPE', type(args).__name__)}: the vllm attention backend runs gqa only"
    if args.parallel is not None and not args.parallel.is_single:
        return f"parallel {args.parallel.label()}: {MULTI_RANK}"
    why = _projections(args)
    if why is not None:
        return why
    choice = module_choice(args)
    return choice if isinstance(choice, str) else None


def mla_refusal(args: OpArgs) -> Optional[str]:
    """None when the vllm mla backend can build the case (vLLM and the device aside); else why, by field."""
    if not isinstance(args, MlaArgs):
        return f"{getattr(args, 'TYPE', type(args).__name__)}: the vllm mla backend runs mla only"
    if args.parallel is not None and not args.parallel.is_single:
        return f"parallel {args.parallel.label()}: {MULTI_RANK}"
    why = _projections(args)
    if why is not None:
        return why
    if args.gate:
        return ("gate: MLA's output gate (g_proj, Kimi-K3) has no vLLM 0.26 module; DeepseekV2MLAAttention has "
                "no gate")
    if not args.rope:
        return ("rope off: DeepseekV2MLAAttention always applies RoPE; vLLM's NoPE MLA (KimiMLAAttention) has no "
                "q_lora_rank, which every mla case sets")
    if args.kv_cache_dtype == "fp8":
        return ("kv_cache_dtype=fp8: the vllm mla backend fills and reads back bf16 latent caches only (vLLM's "
                "sm90 MLA backend, FLASH_ATTN_MLA, has no fp8 cache; the e4m3 read-back is not built)")
    return None
