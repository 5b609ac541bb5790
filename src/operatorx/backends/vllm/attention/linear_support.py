"""Can the vllm linear-attention backend run this gdn / kda case, and as which vLLM 0.26 module? No vLLM import.

The rule: a case runs as vLLM's own module of its type, built alone, and is refused by field where that
module would compute something else than the case says:
- gdn -> Qwen3.5's `QwenGatedDeltaNetAttention` (gdn/qwen_gdn_linear_attn.py, gqa_interleaved_layout=False:
  the checkpoint's in_proj_qkv / in_proj_z / in_proj_a / in_proj_b, which the case's projections name),
  norm_act silu or sigmoid through its config's output_gate_type; the state in fp32 or bf16 through
  CacheConfig.mamba_ssm_cache_dtype (MambaStateDtypeCalculator.gated_delta_net_state_dtype);
- kda -> Kimi Linear's `KimiGatedDeltaNetAttention` (gdn/kimi_gdn_linear_attn.py): its decay projection
  f_a_proj is hidden -> head_dim, so gate_rank must be unset or head_dim; its recurrent state is always
  fp32 (MambaStateDtypeCalculator.kda_state_dtype), so state_dtype bf16 is refused; and its output gate
  is low rank (g_a_proj hidden -> head_dim, g_b_proj head_dim -> heads·head_dim) where the case's g_proj
  is one hidden -> heads·head_dim projection (spec/attention.py KdaArgs._add_cost counts it so): every
  kda case (Kimi-K3's full-rank gate) is refused for that (KDA_GATE).
Both: head_dim at most 256 (FLA's chunk_delta_h holds K <= 256), conv_kernel 2..5 (causal_conv1d_fn's
widths); bf16 projections only; one rank only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from operatorx.backends.vllm.attention.support import MULTI_RANK
from operatorx.spec.attention import AttentionArgs, GdnArgs, KdaArgs
from operatorx.spec.op_type import OpArgs

__all__ = ["LinearModule", "QWEN_GDN", "KIMI_KDA", "KDA_GATE", "MAX_HEAD_DIM", "CONV_WIDTHS", "linear_module",
           "linear_refusal", "build_refusal", "SSM_CACHE_DTYPE"]

#: FLA chunk_delta_h's largest key head dim.
MAX_HEAD_DIM = 256
#: causal_conv1d_fn's kernel widths (its update kernel also has 6; prefill decides).
CONV_WIDTHS = (2, 3, 4, 5)
#: gdn `state_dtype` -> CacheConfig.mamba_ssm_cache_dtype.
SSM_CACHE_DTYPE = {"fp32": "float32", "bf16": "bfloat16"}
KDA_GATE = ("g_proj: the case's output gate is one full-rank projection hidden -> heads·head_dim (Kimi-K3's; "
            "its cost counts that); vLLM 0.26 has only Kimi-Linear's KimiGatedDeltaNetAttention, whose gate is low "
            "rank (g_a_proj hidden -> head_dim, g_b_proj head_dim -> heads·head_dim): a different, cheaper module")


@dataclass(frozen=True)
class LinearModule:
    """The vLLM module class that builds the case: `module` is its import path, `cls` its name."""

    module: str
    cls: str

    @property
    def path(self) -> str:
        return f"{self.module}.{self.cls}"


QWEN_GDN = LinearModule("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn", "QwenGatedDeltaNetAttention")
KIMI_KDA = LinearModule("vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn", "KimiGatedDeltaNetAttention")


def linear_module(args: AttentionArgs) -> LinearModule:
    return QWEN_GDN if isinstance(args, GdnArgs) else KIMI_KDA


def _projections(args: AttentionArgs) -> Optional[str]:
    for name, pair in (args.proj or {}).items():
        for side, op in (("a", pair.a), ("b", pair.b)):
            if op.dtype != "bf16" or op.arrives_as(activation=side == "a") != "bf16":
                return (f"proj.{name}.{side}: {op.scheme_name()}: quantized linear-attention projections are not "
                        "wired into the vllm backend yet")
    return None


def _shared(args: GdnArgs | KdaArgs) -> Optional[str]:
    if args.parallel is not None and not args.parallel.is_single:
        return f"parallel {args.parallel.label()}: {MULTI_RANK}"
    why = _projections(args)
    if why is not None:
        return why
    if args.head_dim > MAX_HEAD_DIM:
        return (f"head_dim={args.head_dim}: vLLM's chunked delta-rule kernels (FLA chunk_delta_h) hold head dims "
                f"up to {MAX_HEAD_DIM}")
    if args.conv_kernel not in CONV_WIDTHS:
        return (f"conv_kernel={args.conv_kernel}: vLLM's causal_conv1d_fn has kernel widths "
                f"{CONV_WIDTHS[0]}-{CONV_WIDTHS[-1]}")
    return None


def _kda(args: KdaArgs) -> Optional[str]:
    if args.gate_rank is not None and args.gate_rank != args.head_dim:
        return (f"gate_rank={args.gate_rank}: KimiGatedDeltaNetAttention's f_a_proj is hidden -> head_dim "
                f"({args.head_dim}); no other decay rank is built")
    if args.state_dtype != "fp32":
        return (f"state_dtype={args.state_dtype}: KimiGatedDeltaNetAttention keeps its recurrent state in fp32 "
                "(MambaStateDtypeCalculator.kda_state_dtype); vLLM 0.26 cannot hold it in bf16")
    return None


def build_refusal(args: OpArgs) -> Optional[str]:
    """Why vLLM's module cannot be built for the case as linear_build builds it (None: it can); the kda
    output-gate mismatch (KDA_GATE) is not a build refusal, so the module itself stays testable."""
    if not isinstance(args, (GdnArgs, KdaArgs)):
        return f"{getattr(args, 'TYPE', type(args).__name__)}: the vllm linear-attention backend runs gdn and kda"
    why = _shared(args)
    if why is not None or isinstance(args, GdnArgs):
        return why
    return _kda(args)


def linear_refusal(args: OpArgs) -> Optional[str]:
    """None when the vllm linear-attention backend can time the case as it is written (vLLM and the device
    aside); else why, by field (module docstring)."""
    why = build_refusal(args)
    if why is None and isinstance(args, KdaArgs):
        return KDA_GATE
    return why
