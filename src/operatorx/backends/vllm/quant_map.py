"""Operand descriptors → the vLLM 0.26 quantization config that a checkpoint of that scheme
loads with, or the reason vLLM has no real sm90 kernel for it. Pure: no vllm, no torch.

Source of truth: ../shared/docs/vllm-quant-map.md (read from the 0.26.0 wheel). The rule kept
here: if a descriptor quantizes the activations, a weight-only (Marlin) or emulated path in
vLLM is `unsupported`; a weight-only descriptor (bf16 activations) may run weight-only.

The config is named as (module, class, dict for `from_config`): the dict is what the
checkpoint's `quantization_config` holds, so the mapping reads like the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

from operatorx.spec.gemm import GemmArgs
from operatorx.spec.moe import GroupedTopK, MoeArgs, TopK
from operatorx.spec.operand import Operand

__all__ = ["QuantConfigSpec", "Plan", "Scheme", "pair_scheme", "gemm_plan", "moe_plan", "SELECTION_ENV",
           "capture_sizes", "MAX_CAPTURE_SIZE"]

Scheme = Literal["bf16", "fp8_tensor_static", "fp8_token_tensor", "fp8_token_channel", "fp8_block"]

_QUANT = "vllm.model_executor.layers.quantization"

#: Environment variables that change which kernel vLLM 0.26 selects (recorded in every row).
SELECTION_ENV = (
    "VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM", "VLLM_USE_DEEP_GEMM_E8M0",
    "VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER", "VLLM_TEST_FORCE_FP8_MARLIN", "VLLM_DISABLED_KERNELS",
    "VLLM_DISABLE_SHARED_EXPERTS_STREAM", "VLLM_BATCH_INVARIANT", "VLLM_HAS_FLASHINFER_CUBIN",
)

#: vLLM 0.26 `VllmConfig._set_cudagraph_sizes`: max = min(max_num_seqs * 2, 512) → 512 for a
#: serving default (max_num_seqs ≥ 256); sizes [1, 2, 4] + 8..248 step 8 + 256..max step 16.
MAX_CAPTURE_SIZE = 512


def capture_sizes(max_size: int = MAX_CAPTURE_SIZE) -> list[int]:
    sizes = [s for s in (1, 2, 4) if s <= max_size]
    sizes += list(range(8, min(max_size + 1, 256), 8))
    sizes += list(range(256, max_size + 1, 16))
    return sizes


@dataclass(frozen=True)
class QuantConfigSpec:
    module: str
    cls: str
    config: dict[str, Any]
    requires: tuple[str, ...] = ()
    """Python packages the config class imports besides vLLM (checked before building)."""

    def to_json(self) -> dict[str, Any]:
        return {"class": f"{self.module}.{self.cls}", "from_config": self.config,
                **({"requires": list(self.requires)} if self.requires else {})}


@dataclass(frozen=True)
class Plan:
    """How the backend builds the layer: the scheme (checkpoint format) and the vLLM config."""

    scheme: Scheme
    quant: Optional[QuantConfigSpec]
    expected_sm90: str
    """What ../shared/docs/vllm-quant-map.md expects vLLM to select on sm90 (metadata only:
    the row records what vLLM actually selected)."""
    notes: tuple[str, ...] = field(default=())

    @property
    def quantized(self) -> bool:
        return self.quant is not None


def _fp8(op: Operand) -> bool:
    return op.dtype == "e4m3" and op.scale is not None and op.scale2 is None


def _weight_kind(w: Operand) -> Optional[str]:
    assert w.scale is not None
    r_c = w.scale.oriented(weight=True)
    if r_c == (-1, -1):
        return "tensor"
    if r_c == (1, -1):
        return "channel"
    if r_c == (128, 128):
        return "block"
    return None


def _act_kind(a: Operand) -> Optional[str]:
    assert a.scale is not None
    r_c = (a.scale.group[0], a.scale.group[1])
    if r_c == (-1, -1):
        return "tensor_static" if a.scale.static else "tensor_dynamic"
    if r_c == (1, -1) and not a.scale.static:
        return "token"
    if r_c == (1, 128) and not a.scale.static:
        return "group128"
    return None


def _fp4_reason(a: Operand, w: Operand) -> str:
    fmt = "MXFP4" if w.scale is not None and w.scale.dtype == "ue8m0" else "NVFP4"
    if a.dtype not in ("bf16", "fp16"):
        return (f"{fmt} with fp4 activations ({a.scheme_name()} × {w.scheme_name()}): vLLM 0.26 on sm90 has no "
                "fp4 MMA; it runs Marlin weight-only (bf16 activations) or emulation, never this scheme")
    return (f"{fmt} W4A16 ({w.scheme_name()}): vLLM runs it weight-only on sm90 (Marlin / OAI-Triton), but this "
            "backend does not load packed fp4 checkpoints yet")


def pair_scheme(a: Operand, w: Operand, what: str) -> Union[Scheme, str]:
    """The checkpoint scheme of one (activation, weight) pair, or why vLLM has none here."""
    if a.dtype == "bf16" and w.dtype == "bf16":
        if a.arrives_as(activation=True) != "bf16":
            return f"{what}: the activation arrives as {a.arrives_as(activation=True)}; vLLM layers take bf16"
        return "bf16"
    if a.dtype in ("fp16", "fp32") or w.dtype in ("fp16", "fp32"):
        return f"{what}: {a.dtype}×{w.dtype}: the vllm backend builds layers in bf16 (the model dtype) only"
    if w.dtype == "e2m1":
        return f"{what}: {_fp4_reason(a, w)}"
    if w.dtype in ("int4", "int8") or a.dtype in ("int4", "int8"):
        return (f"{what}: integer schemes ({a.scheme_name()} × {w.scheme_name()}) run in vLLM through "
                "GPTQ/AWQ/compressed-tensors checkpoints, not wired in this backend")
    if a.dtype == "bf16" and w.dtype == "e4m3":
        return (f"{what}: fp8 weight-only ({w.scheme_name()}) is Marlin in vLLM (forced only on sm90), not a "
                "W8A8 kernel; not wired")
    if not (_fp8(a) and _fp8(w)):
        return f"{what}: {a.scheme_name()} × {w.scheme_name()}: no vLLM fp8 config takes this pair"
    assert a.scale is not None and w.scale is not None
    if a.arrives_as(activation=True) != "bf16":
        return (f"{what}: the activation arrives as {a.arrives_as(activation=True)}; vLLM's fp8 layers take "
                "bf16 and quantize it inside the layer")
    if (1, 32) in (tuple(a.scale.group), tuple(w.scale.group)):
        return (f"{what}: MXFP8 ({w.scheme_name()}): on sm90 vLLM 0.26 picks MarlinMxfp8LinearKernel / "
                "MarlinExperts (weight-only, bf16 activations) or emulation; the FlashInfer MXFP8 kernels need sm100")
    wk, ak = _weight_kind(w), _act_kind(a)
    if not w.scale.static:
        return f"{what}: dynamic weight scales ({w.scheme_name()}): checkpoints store static weight scales"
    if wk == "block":
        if ak != "group128":
            return (f"{what}: 128x128 block weights take dynamic 1x128 activation groups in vLLM "
                    f"(Fp8Config requires dynamic); got a={a.scheme_name()}")
        if {a.scale.dtype, w.scale.dtype} - {"fp32", "ue8m0"}:
            return f"{what}: block scales are fp32 or ue8m0 in vLLM checkpoints; got {a.scale.dtype}/{w.scale.dtype}"
        return "fp8_block"
    if a.scale.dtype != "fp32" or w.scale.dtype != "fp32":
        return f"{what}: per-tensor/per-channel fp8 scales are fp32 in vLLM; got {a.scale.dtype}/{w.scale.dtype}"
    if wk == "tensor":
        if ak == "tensor_static":
            return "fp8_tensor_static"
        if ak == "token":
            return "fp8_token_tensor"
        if ak == "tensor_dynamic":
            return (f"{what}: dynamic per-tensor activations: with CUTLASS (sm90) vLLM's Fp8Config quantizes "
                    "dynamic activations per token (kFp8DynamicTokenSym), so per-tensor dynamic is not offered")
    if wk == "channel":
        if ak == "token":
            return "fp8_token_channel"
        return (f"{what}: per-channel weights pair with dynamic per-token activations in vLLM "
                f"(compressed-tensors / ModelOpt); got a={a.scheme_name()}")
    return f"{what}: fp8 a={a.scheme_name()} × w={w.scheme_name()}: no vLLM checkpoint format has this pair"


_FP8_MODULE = f"{_QUANT}.fp8"
_MODELOPT = f"{_QUANT}.modelopt"
_CT = f"{_QUANT}.compressed_tensors.compressed_tensors"


def _ct_channel_config() -> QuantConfigSpec:
    weights = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False}
    acts = {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True}
    cfg = {"quant_method": "compressed-tensors", "format": "float-quantized",
           "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts}}}
    return QuantConfigSpec(_CT, "CompressedTensorsConfig", cfg, requires=("compressed_tensors",))


def _plan(scheme: Scheme, op: Literal["gemm", "moe"]) -> Plan:
    if scheme == "bf16":
        expected = "UnquantizedLinearMethod (F.linear)" if op == "gemm" else "UnquantizedFusedMoEMethod → TritonExperts"
        return Plan(scheme, None, expected)
    if scheme == "fp8_block":
        cfg = QuantConfigSpec(_FP8_MODULE, "Fp8Config", {"quant_method": "fp8", "activation_scheme": "dynamic",
                                                          "weight_block_size": [128, 128]})
        expected = ("DeepGemmFp8BlockScaledMMKernel (no FlashInfer; VLLM_USE_DEEP_GEMM=0 → CUTLASS block)"
                    if op == "gemm" else "Fp8MoEMethod → TRITON (TritonExperts) at EP=1")
        notes = ("with VLLM_USE_DEEP_GEMM_E8M0=1 (default) vLLM runs power-of-two (ue8m0) scales for both "
                 "fp32 and ue8m0 descriptors; synthetic weight scales are powers of two so its requantization "
                 "is lossless",)
        return Plan(scheme, cfg, expected, notes)
    if scheme == "fp8_tensor_static":
        cfg = QuantConfigSpec(_FP8_MODULE, "Fp8Config", {"quant_method": "fp8", "activation_scheme": "static"})
        expected = ("CutlassFP8ScaledMMLinearKernel" if op == "gemm"
                    else "Fp8MoEMethod → TRITON (FLASHINFER_CUTLASS when FlashInfer is installed)")
        return Plan(scheme, cfg, expected)
    if scheme == "fp8_token_tensor":
        cfg = QuantConfigSpec(_FP8_MODULE, "Fp8Config", {"quant_method": "fp8", "activation_scheme": "dynamic"})
        expected = ("CutlassFP8ScaledMMLinearKernel (per-token × per-tensor)" if op == "gemm"
                    else "Fp8MoEMethod → TRITON")
        return Plan(scheme, cfg, expected)
    assert scheme == "fp8_token_channel"
    if op == "gemm":
        cfg = QuantConfigSpec(_MODELOPT, "ModelOptFp8Config",
                              {"quant_method": "modelopt", "quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"})
        return Plan(scheme, cfg, "ModelOptFp8PcPtLinearMethod → CutlassFP8ScaledMMLinearKernel",
                    ("ModelOpt's per-channel config: compressed-tensors is not needed for a linear layer",))
    return Plan(scheme, _ct_channel_config(), "CompressedTensorsW8A8Fp8MoEMethod → VLLM_CUTLASS "
                "(TritonOrCutlassExperts → CutlassExpertsFp8 on sm90)")


def gemm_plan(args: GemmArgs) -> Union[Plan, str]:
    if args.out != "bf16":
        return f"out={args.out}: vLLM's linear layers return the model dtype (bf16 here)"
    if args.activation is not None:
        return "a GEMM with a fused activation epilogue is not one vLLM linear layer"
    scheme = pair_scheme(args.a, args.b, "gemm")
    if scheme not in ("bf16", "fp8_tensor_static", "fp8_token_tensor", "fp8_token_channel", "fp8_block"):
        return scheme
    if args.bias and scheme != "bf16" and args.bias not in (True, "bf16"):
        return f"bias dtype {args.bias}: vLLM's linear bias is in the model dtype (bf16)"
    return _plan(scheme, "gemm")  # type: ignore[arg-type]


def _moe_refusal(args: MoeArgs) -> Optional[str]:
    e, r, act = args.experts, args.router, args.activation
    if args.out != "bf16":
        return f"out={args.out}: vLLM's FusedMoE returns the model dtype (bf16 here)"
    if act.kind not in ("silu", "gelu") or not act.is_gated or act.interleaved or act.limit is not None:
        return (f"activation {act.kind} (gated={act.is_gated}, interleaved={bool(act.interleaved)}, "
                f"limit={act.limit}): wired here are gated silu/gelu with gate rows before up rows "
                "(swigluoai / clamped SwiGLU run in vLLM with MXFP4 or DeepSeek-V4 checkpoints, not wired)")
    if e.latent or e.zero or e.bias or r.weight_on_input:
        return "latent projections, zero experts, expert biases and router-weight-on-input are not wired here"
    if not isinstance(r.select, (TopK, GroupedTopK)):
        return f"router selection {r.select.kind!r} (hash routing) is not wired here"
    if r.scoring not in ("softmax", "sigmoid"):
        return f"scoring {r.scoring!r}: wired here are softmax and sigmoid routers"
    if r.gate.dtype != "bf16":
        return "an fp32 router gate is not wired here (vLLM's DeepSeek/Qwen gates are bf16)"
    if args.shared is not None and args.shared.count != 1 and args.shared.gate is not None:
        return "several gated shared experts are not one vLLM shared-expert MLP"
    return None


def moe_plan(args: MoeArgs) -> Union[Plan, str]:
    why = _moe_refusal(args)
    if why:
        return why
    e = args.experts
    scheme = pair_scheme(e.a1, e.w1, "experts")
    if scheme not in ("bf16", "fp8_tensor_static", "fp8_token_tensor", "fp8_token_channel", "fp8_block"):
        return scheme
    if e.w2.model_dump() != e.w1.model_dump() or e.a2.model_dump() != e.a1.model_dump():
        return ("experts: w2/a2 descriptors differ from w1/a1; one vLLM quant config quantizes both expert "
                "GEMMs the same way")
    if scheme == "fp8_token_tensor":
        return ("experts: per-token activations × per-tensor weights: vLLM's Fp8MoEMethod quantizes MoE "
                "activations per tensor for per-tensor weights; no MoE path keeps per-token here")
    if scheme == "fp8_tensor_static":
        return ("experts: static per-tensor activation scales need a calibrated scale for the second expert "
                "GEMM's input; not wired here (vLLM runs it: Fp8Config static → TRITON)")
    if args.shared is not None:
        s = args.shared
        shared = pair_scheme(s.a1, s.w1, "shared experts")
        if shared != scheme or s.w2.model_dump() != s.w1.model_dump():
            return (f"shared experts ({s.w1.scheme_name()}) and routed experts ({e.w1.scheme_name()}) differ: a "
                    "vLLM model block quantizes both with the checkpoint's one config")
    return _plan(scheme, "moe")  # type: ignore[arg-type]
