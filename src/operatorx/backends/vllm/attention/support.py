"""Can the vllm gqa backend run this case, and which of vLLM 0.26's model modules is it? No vLLM import.

The rule: a gqa case runs as the attention module of the vLLM model that has its form, built alone:
- `gate` (sigmoid output gate packed in q_proj): Qwen3-Next's / Qwen3.5's `Qwen3NextAttention`, which
  always has q/k norm and no sliding window, so gate without qk_norm and gate with a window are refused;
- `qk_norm`: Qwen3's `Qwen3Attention` (a window through its `per_layer_sliding_window`);
- neither: Llama's `LlamaAttention` (a window through the config's `layer_types` / `sliding_window`).
M-RoPE (`mrope_section`) goes through each module's `get_rope` (vLLM's `MRotaryEmbedding`).
An mla case runs as DeepSeek-V2/V3's `DeepseekV2MLAAttention` (q_lora_rank is always set in the spec:
its fused_qkv_a_proj path); `mla_refusal` names what that module or this backend cannot do.
Projections: bf16, or block FP8 (128x128 weights, 1x128 dynamic activations) on all of them under one
Fp8Config (`projection_plan`); any other scheme is refused by field, never emulated; so is a split over ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union

from operatorx.spec.attention import AttentionArgs, GqaArgs, MlaArgs
from operatorx.spec.op_type import OpArgs

if TYPE_CHECKING:
    from operatorx.backends.vllm.quant_map import Plan

__all__ = ["ModuleChoice", "module_choice", "refusal", "mla_refusal", "projection_plan", "PROJECTION_SCHEMES",
           "projection_bound", "CACHE_DTYPE", "MULTI_RANK", "DEEPSEEK_MLA", "type_and_split"]

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


#: The projection schemes the attention backends load (one quant config for the module's layers).
PROJECTION_SCHEMES = ("bf16", "fp8_block")


def module_projections(args: AttentionArgs) -> tuple[str, ...]:
    """The projections the case's module has: its type's, less an MLA's g_proj when it has no gate."""
    if isinstance(args, MlaArgs) and not args.gate:
        return tuple(n for n in args.PROJECTIONS if n != "g_proj")
    return args.PROJECTIONS


def projection_plan(args: AttentionArgs) -> Union[Plan, str]:
    """The one linear plan every projection of the module shares (absent = bf16), or why there is none,
    by field: a scheme vLLM has no layer for here (quant_map's reason), one these backends do not load
    yet, or a mix (vLLM builds a module's projections under one quant config)."""
    from operatorx.backends.vllm.quant_map import linear_plan, pair_scheme

    chosen: dict[str, tuple[str, Any]] = {}
    for name in module_projections(args):
        pair = (args.proj or {}).get(name)
        if pair is None:
            chosen[name] = ("bf16", None)
            continue
        scheme = pair_scheme(pair.a, pair.b, f"proj.{name}")
        if scheme not in PROJECTION_SCHEMES:
            return scheme if scheme.startswith("proj.") else (
                f"proj.{name}: {scheme} attention projections are not loaded by the vllm attention backends "
                f"(they load {' and '.join(PROJECTION_SCHEMES)})")
        chosen[name] = (scheme, pair.b)
    kinds = {scheme for scheme, _ in chosen.values()}
    if len(kinds) > 1:
        mixed = ", ".join(f"{n}={s}" for n, (s, _) in chosen.items())
        return (f"proj: {mixed}: bf16 beside quantized projections needs a per-layer quant config "
                "(ignored_layers), not built")
    scheme, weight = next(iter(chosen.values()))
    if scheme == "bf16":
        return linear_plan("bf16", weight)
    scale_dtypes = {b.scale.dtype for _, b in chosen.values() if b is not None and b.scale is not None}
    if len(scale_dtypes) > 1:
        return f"proj: weight scales in {sorted(scale_dtypes)}: one quant config loads one scale dtype"
    return linear_plan(scheme, weight)  # type: ignore[arg-type]


def projection_bound(args: AttentionArgs) -> float:
    """The check's bound the projections allow: 0 for bf16 (the module's own bound rules), else
    check.fp8_projection_bound of the op type."""
    from operatorx.backends.check import fp8_projection_bound

    plan = projection_plan(args)
    return fp8_projection_bound(args.TYPE) if not isinstance(plan, str) and plan.scheme == "fp8_block" else 0.0


def _projections(args: AttentionArgs) -> Optional[str]:
    plan = projection_plan(args)
    return plan if isinstance(plan, str) else None


def type_and_split(args: OpArgs, cls: type[AttentionArgs], backend: str) -> Optional[str]:
    """The first refusals of every vllm attention backend: another op type, then a multi-rank split."""
    if not isinstance(args, cls):
        return f"{getattr(args, 'TYPE', type(args).__name__)}: the vllm {backend} backend runs {cls.TYPE} only"
    if args.parallel is not None and not args.parallel.is_single:
        return f"parallel {args.parallel.label()}: {MULTI_RANK}"
    return None


def refusal(args: OpArgs) -> Optional[str]:
    """None when the vllm gqa backend can build the case (vLLM and the device aside); else why, by field."""
    why = type_and_split(args, GqaArgs, "attention")
    if why is not None:
        return why
    assert isinstance(args, GqaArgs)
    why = _projections(args)
    if why is not None:
        return why
    choice = module_choice(args)
    return choice if isinstance(choice, str) else None


def mla_refusal(args: OpArgs) -> Optional[str]:
    """None when the vllm mla backend can build the case (vLLM and the device aside); else why, by field."""
    why = type_and_split(args, MlaArgs, "mla")
    if why is not None:
        return why
    assert isinstance(args, MlaArgs)
    why = _projections(args)
    if why is not None:
        return why
    if args.gate:
        return ("gate: MLA's output gate (g_proj, Kimi-K3) has no vLLM 0.26 module; DeepseekV2MLAAttention has "
                "no gate")
    if not args.rope:
        return ("rope off: DeepseekV2MLAAttention always applies RoPE; vLLM's NoPE MLA (KimiMLAAttention) has no "
                "q_lora_rank, which every mla case sets")
    return None
