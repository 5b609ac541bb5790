"""Operand descriptors → the vLLM 0.26 quantization config that a checkpoint of that scheme
loads with, or the reason vLLM has no real sm90 kernel for it. Pure: no vllm, no torch.

Source of truth: ../shared/docs/vllm-quant-map.md (read from the 0.26.0 wheel). The rule kept
here: if a descriptor quantizes the activations, a weight-only (Marlin) or emulated path in
vLLM is `unsupported`; a weight-only descriptor (bf16 activations) may run weight-only.

The config is named as (module, class, dict for `from_config`): the dict is what the
checkpoint's `quantization_config` holds, so the mapping reads like the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, Optional, Union, cast

from operatorx.spec.gemm import GemmArgs
from operatorx.spec.moe import Activation, GroupedTopK, HashSelect, MoeArgs
from operatorx.spec.operand import Operand

__all__ = ["QuantConfigSpec", "Plan", "Scheme", "pair_scheme", "gemm_plan", "moe_plan", "SELECTION_ENV",
           "capture_sizes", "MAX_CAPTURE_SIZE", "MoeAct", "moe_activation", "GateWiring", "gate_wiring",
           "SWIGLUOAI_KERNEL_DEFAULTS", "linear_plan"]

Scheme = Literal["bf16", "fp8_tensor_static", "fp8_token_tensor", "fp8_token_channel", "fp8_block", "mxfp4_w4a16",
                 "int4_w4a16"]
_GEMM_SCHEMES = ("bf16", "fp8_tensor_static", "fp8_token_tensor", "fp8_token_channel", "fp8_block")
_MOE_SCHEMES = _GEMM_SCHEMES + ("mxfp4_w4a16", "int4_w4a16")

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
    weight_scale_dtype: Literal["fp32", "bf16", "ue8m0"] = "fp32"
    """The dtype the checkpoint stores 128x128 block weight scales in. vLLM 0.26's Fp8 methods
    register `weight_scale_inv` as fp32 parameters and the loader's `param.data.copy_` upcasts a
    bf16 tensor (Qwen3.5/Qwen3-Next FP8 checkpoints) into them; DeepSeek-V4's config registers
    them as `float8_e8m0fnu` (ue8m0) and its checkpoints store them so. The synthetic scales are
    powers of two, exact in all three."""

    shared_scheme: Optional[Scheme] = None
    """The shared MLP's scheme where it differs from the routed experts': `bf16` (a layer the
    checkpoint leaves unquantized) or `fp8_block` (DeepSeek-V4: MXFP4 routed experts, block-FP8
    shared expert, one config); None means the same."""

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
            "backend loads packed fp4 weights only for MXFP4 MoE experts")


def _mxfp4_weights(w: Operand) -> bool:
    """e2m1 values with one static ue8m0 scale per 1x32 along K: OCP MXFP4 as checkpoints store it."""
    return (w.dtype == "e2m1" and w.scale2 is None and w.scale is not None and w.scale.dtype == "ue8m0"
            and w.scale.static and w.scale.oriented(weight=True) == (1, 32))


def pair_scheme(a: Operand, w: Operand, what: str) -> Union[Scheme, str]:
    """The checkpoint scheme of one (activation, weight) pair, or why vLLM has none here."""
    if a.dtype == "bf16" and w.dtype == "bf16":
        if a.arrives_as(activation=True) != "bf16":
            return f"{what}: the activation arrives as {a.arrives_as(activation=True)}; vLLM layers take bf16"
        return "bf16"
    if a.dtype in ("fp16", "fp32") or w.dtype in ("fp16", "fp32"):
        return f"{what}: {a.dtype}×{w.dtype}: the vllm backend builds layers in bf16 (the model dtype) only"
    if w.dtype == "e2m1":
        if a.dtype == "bf16" and a.arrives_as(activation=True) == "bf16" and _mxfp4_weights(w):
            return "mxfp4_w4a16"
        return f"{what}: {_fp4_reason(a, w)}"
    if (w.dtype == "int4" and a.dtype == "bf16" and a.arrives_as(activation=True) == "bf16" and w.scale2 is None
            and w.scale is not None and w.scale.static and w.scale.dtype == "bf16"
            and w.scale.oriented(weight=True) == (1, 32)):
        return "int4_w4a16"
    if w.dtype == "int4" and a.dtype == "bf16":
        return (f"{what}: INT4 W4A16 ({w.scheme_name()}) runs in vLLM 0.26 on sm90 through compressed-tensors "
                "pack-quantized → CompressedTensorsWNA16MarlinMoEMethod (Marlin); this backend does not load that "
                "packed layout yet")
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
    r_c = w.scale.oriented(weight=True)
    if _weight_kind(w) is None and r_c[0] > 1 and r_c[1] > 1:
        return (f"{what}: {r_c[0]}x{r_c[1]} block weight scales (DeepSeek-V4.1's FP8 layers use 32x32): vLLM 0.26 has "
                "no deepseek_v41 model to load such a checkpoint, its block-FP8 MoE method takes 128x128 blocks only "
                "(kFp8Static128BlockSym), and this backend builds 128x128 blocks only")
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
        if a.scale.dtype not in ("fp32", "ue8m0"):
            return (f"{what}: 1x128 activation scales are computed by vLLM at run time in fp32 (power-of-two "
                    f"with DeepGEMM E8M0); a {a.scale.dtype} activation scale is not one of its options")
        if w.scale.dtype not in ("fp32", "ue8m0", "bf16"):
            return (f"{what}: 128x128 weight scales load into vLLM's fp32 `weight_scale_inv` from fp32, bf16 "
                    f"or ue8m0 checkpoint tensors; got {w.scale.dtype}")
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


def _with_scale_dtype(plan: Plan, w: Operand) -> Plan:
    if plan.scheme == "fp8_block" and w.scale is not None and w.scale.dtype == "bf16":
        return replace(plan, weight_scale_dtype="bf16",
                       notes=plan.notes + ("block weight scales stored in bf16 (as the checkpoint has them); vLLM's "
                                           "loader copies them into its fp32 weight_scale_inv",))
    return plan


def linear_plan(scheme: Scheme, w: Operand) -> Plan:
    """The plan of a linear layer of `scheme` whose weight is `w` (a model's projection)."""
    return _with_scale_dtype(_plan(scheme, "gemm"), w)


def gemm_plan(args: GemmArgs) -> Union[Plan, str]:
    if args.out != "bf16":
        return f"out={args.out}: vLLM's linear layers return the model dtype (bf16 here)"
    if args.activation is not None:
        return "a GEMM with a fused activation epilogue is not one vLLM linear layer"
    scheme = pair_scheme(args.a, args.b, "gemm")
    if scheme == "mxfp4_w4a16":
        return f"gemm: {_fp4_reason(args.a, args.b)}"
    if scheme == "int4_w4a16":
        return ("gemm: INT4 W4A16 linear layers run in vLLM through compressed-tensors (Marlin); this backend loads "
                "packed INT4 for MoE experts only")
    if scheme not in _GEMM_SCHEMES:
        return scheme
    if args.bias and scheme != "bf16" and args.bias not in (True, "bf16"):
        return f"bias dtype {args.bias}: vLLM's linear bias is in the model dtype (bf16)"
    return _with_scale_dtype(_plan(scheme, "gemm"), args.b)  # type: ignore[arg-type]


#: `torch.ops._C.swigluoai_and_mul(out, input, alpha=1.702, limit=7.0)` (beta 1 in the kernel):
#: vLLM 0.26's `apply_moe_activation` calls it with no alpha/limit, so the interleaved
#: swigluoai of FusedMoE always runs gpt-oss's constants.
SWIGLUOAI_KERNEL_DEFAULTS = {"alpha": 1.702, "beta": 1.0, "limit": 7.0}

#: vLLM 0.26 `MoEActivation` values (fused_moe/activation.py), for refusal texts.
_VLLM_MOE_ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "relu2", "swigluoai", "swigluoai_uninterleave", "swiglustep",
                         "*_no_mul")


@dataclass(frozen=True)
class MoeAct:
    """What `FusedMoE(activation=, swiglu_limit=, swiglu_alpha=, swiglu_beta=)` gets for the case's
    activation, and the shared MLP's act-and-mul module (vllm.model_executor.layers.activation)."""

    vllm_name: str
    limit: Optional[float] = None
    alpha: Optional[float] = None
    beta: Optional[float] = None
    shared: str = "SiluAndMul"
    """SiluAndMul | GeluAndMul | GeluAndMul(tanh) | SiluAndMulWithClamp | - (no shared MLP form)."""

    def fused_moe_kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"activation": self.vllm_name}
        if self.limit is not None:
            out["swiglu_limit"] = self.limit
        if self.alpha is not None:
            out["swiglu_alpha"] = self.alpha
        if self.beta is not None:
            out["swiglu_beta"] = self.beta
        return out


def moe_activation(act: Activation) -> Union[MoeAct, str]:
    """The case's expert activation as vLLM 0.26's FusedMoE computes it, or why it has no such form.

    Read from fused_moe/activation.py (`MoEActivation`, `apply_moe_activation`) and
    experts/triton_moe.py (`TritonExperts.activation`): a `swiglu_limit` on `silu` runs
    `swiglu_limit_func` (gate clamped above, up clamped both ways: DeepSeek-V4); `swigluoai`
    reads gate/up interleaved at the kernel's fixed constants; `swigluoai_uninterleave` reads
    the halves and takes limit/alpha/beta (MiniMax-M3).
    """
    kind = act.kind
    if kind == "situ":
        return ("activation situ (Kimi-K3): docs/case-format.md does not define situ yet, and vLLM 0.26 has no "
                f"MoEActivation of that kind (it has {', '.join(_VLLM_MOE_ACTIVATIONS)})")
    if kind == "swiglustep":
        return ("activation swiglustep: vLLM 0.26 has it (swiglustep_and_mul, a fixed clamp of 7), but "
                "docs/case-format.md does not define it yet; not wired")
    if not act.is_gated:
        return (f"non-gated {kind} experts: vLLM 0.26 runs them as {kind}_no_mul (w13 holds I rows); this backend "
                "builds gated w13 [E, 2I, H] only")
    extra = {"limit": act.limit, "alpha": act.alpha, "beta": act.beta}
    if kind == "swigluoai":
        if act.interleaved:
            given = {k: v for k, v in extra.items() if v is not None and v != SWIGLUOAI_KERNEL_DEFAULTS[k]}
            if given:
                return (f"swigluoai (interleaved) with {given}: vLLM 0.26's interleaved kernel "
                        "(_C.swigluoai_and_mul via apply_moe_activation) runs only alpha 1.702, limit 7, beta 1")
            return MoeAct("swigluoai", shared="-")
        vals = {k: (v if v is not None else SWIGLUOAI_KERNEL_DEFAULTS[k]) for k, v in extra.items()}
        return MoeAct("swigluoai_uninterleave", vals["limit"], vals["alpha"], vals["beta"], "SiluAndMulWithClamp")
    if act.interleaved:
        return (f"{kind} with interleaved gate/up rows: vLLM 0.26's FusedMoE reads interleaved rows only for "
                "swigluoai")
    if act.alpha is not None or act.beta is not None:
        return f"{kind} with alpha/beta: only swigluoai takes them (the case format and vLLM agree)"
    if act.limit is not None:
        if kind != "silu":
            return (f"{kind} with limit {act.limit}: vLLM 0.26 clamps only SiLU (swiglu_limit → "
                    "silu_and_mul_with_clamp / swiglu_limit_func)")
        return MoeAct("silu", limit=float(act.limit), shared="SiluAndMulWithClamp")
    shared = {"silu": "SiluAndMul", "gelu": "GeluAndMul", "gelu_tanh": "GeluAndMul(tanh)"}[kind]
    return MoeAct(kind, shared=shared)


@dataclass(frozen=True)
class GateWiring:
    """Which vLLM 0.26 model block the router gate mirrors (model_executor/models/*.py)."""

    style: Literal["deepseek_v2", "deepseek_v4", "qwen2_moe", "glm4_moe", "minimax_m2"]
    gate_cls: str
    params_fp32: bool
    logits_fp32: bool
    routed_scale_on_output: bool
    """FusedMoE(apply_routed_scale_to_output=True): the runner scales the routed output, the
    router's top-k weights stay unscaled (Glm4MoE on CUDA)."""
    external: bool
    """The block calls the gate and hands the logits to FusedMoE (GLM, MiniMax); otherwise the
    runner holds the gate (`FusedMoE(gate=...)`, DeepSeek/Qwen)."""


def gate_wiring(args: MoeArgs) -> Union[GateWiring, str]:
    r = args.router
    g = r.gate
    logits = g.logits or g.dtype
    if r.scoring == "sqrtsoftplus":
        if g.dtype != "bf16" or logits != "fp32":
            return (f"sqrtsoftplus scoring with a {g.dtype} gate and {logits} logits: vLLM's sqrtsoftplus block "
                    "(DeepseekV4MoE) has a bf16 GateLinear with fp32 logits")
        return GateWiring("deepseek_v4", "GateLinear", False, True, False, False)
    if g.dtype == "fp32":
        if logits != "fp32":
            return ("an fp32 router gate with bf16 logits: vLLM's fp32 gates (Glm4MoE nn.Linear, MiniMaxM2 GateLinear) "
                    "return fp32 logits")
        if isinstance(r.select, GroupedTopK):
            # Glm4MoE: nn.Linear(dtype=fp32) called on hidden_states.to(fp32); FusedMoE(use_grouped_topk=True,
            # router_logits_dtype=fp32, apply_routed_scale_to_output=True on CUDA)
            return GateWiring("glm4_moe", "torch.nn.Linear", True, True, True, True)
        # MiniMaxM2MoE: GateLinear(params_dtype=fp32, out_dtype=fp32) on the bf16 hidden states
        return GateWiring("minimax_m2", "GateLinear", True, True, False, True)
    if r.scoring == "sigmoid":
        # DeepseekV2DecoderLayer builds DeepseekV2MoE(apply_routed_scale_to_output=not aiter): True on CUDA
        return GateWiring("deepseek_v2", "GateLinear", False, logits == "fp32", True, False)
    if logits == "fp32":
        return ("a bf16 gate with fp32 logits and softmax scoring: vLLM's softmax blocks (Qwen2Moe/Qwen3Next/Mixtral) "
                "use a ReplicatedLinear gate that returns bf16 logits")
    return GateWiring("qwen2_moe", "ReplicatedLinear", False, False, False, False)


def _gpt_oss_experts(args: MoeArgs, scheme: str) -> bool:
    """MXFP4 experts with gpt-oss's interleaved swigluoai: the layer `GptOssMxfp4Config` builds."""
    act = moe_activation(args.activation)
    return scheme == "mxfp4_w4a16" and isinstance(act, MoeAct) and act.vllm_name == "swigluoai"


def _moe_refusal(args: MoeArgs, biases_wired: bool = False) -> Optional[str]:
    e, r = args.experts, args.router
    if args.out != "bf16":
        return f"out={args.out}: vLLM's FusedMoE returns the model dtype (bf16 here)"
    act = moe_activation(args.activation)
    if isinstance(act, str):
        return act
    if e.latent:
        return ("latent experts: vLLM 0.26 has no Kimi-K3 model; its only latent MoE is NemotronH "
                "(FusedMoE(routed_input_transform=fc1_latent_proj, routed_output_transform=fc2_latent_proj), "
                "non-gated relu2 experts, no latent norm), which the case format has no activation kind for; "
                "not wired")
    if e.zero:
        return ("zero (identity) experts: vLLM 0.26 has FusedMoE(zero_expert_type=) → ZeroExpertRouter (LongCat); "
                "not wired in this backend")
    if e.local is not None and e.local < e.num:
        return (f"experts.local={e.local} of {e.num}: vLLM builds an expert-parallel FusedMoE (its expert_map) only "
                "inside an EP group of its ranks; a one-device shard of it needs the multi-rank path")
    if e.bias and not biases_wired:
        return ("expert biases: vLLM 0.26 has FusedMoE(has_bias=True) (w13_bias/w2_bias); this backend loads them "
                "with gpt-oss's MXFP4 experts (GptOssMxfp4MoEMethod) only")
    if r.weight_on_input:
        return ("router weight on the input: vLLM 0.26 has FusedMoE(apply_router_weight_on_input=True) (Llama4MoE); "
                "not wired in this backend")
    hashed = isinstance(r.select, HashSelect)
    if hashed and r.scoring != "sqrtsoftplus":
        return (f"hash routing with {r.scoring} scoring: on CUDA vLLM 0.26 reads the hash table only in "
                "topk_hash_softplus_sqrt (sqrtsoftplus, DeepseekV4MoE); ops.topk_softmax/topk_sigmoid ignore it")
    if hashed and r.bias:
        return ("hash routing with a score-correction bias: DeepseekV4MoE's hash layers have none, and vLLM's "
                "hash path never reads it")
    if r.scoring == "sqrtsoftplus":
        if isinstance(r.select, GroupedTopK):
            return ("sqrtsoftplus with grouped top-k: vLLM 0.26's GroupedTopKRouter scores softmax/sigmoid only; "
                    "sqrtsoftplus runs in FusedTopKBiasRouter (plain top-k or hash)")
        if not hashed and not r.bias:
            return ("sqrtsoftplus without a correction bias or hash table: vLLM 0.26 then builds FusedTopKRouter, "
                    "which has no sqrtsoftplus (FusedTopKBiasRouter does, DeepSeek-V4)")
    gw = gate_wiring(args)
    if isinstance(gw, str):
        return gw
    if args.shared is not None:
        s = args.shared
        if s.count != 1 and s.gate is not None:
            return "several gated shared experts are not one vLLM shared-expert MLP"
        if act.shared == "-":
            return ("a shared expert with interleaved swigluoai: vLLM's shared MLPs (MergedColumnParallelLinear) "
                    "hold gate then up rows; no vLLM model has an interleaved shared expert")
    return None


def moe_plan(args: MoeArgs) -> Union[Plan, str]:
    e = args.experts
    # the scheme first: where vLLM has no sm90 kernel for it, that is the reason, whatever else the layer has
    scheme = pair_scheme(e.a1, e.w1, "experts")
    if scheme not in _MOE_SCHEMES:
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
    shared_scheme: Optional[Scheme] = None
    if args.shared is not None:
        s = args.shared
        shared = pair_scheme(s.a1, s.w1, "shared experts")
        same_pair = s.w2.model_dump() == s.w1.model_dump()
        if shared not in _MOE_SCHEMES:
            return shared           # the shared expert's own scheme has no vLLM form: that is the reason
        if shared == "bf16" and scheme != "bf16" and same_pair:
            shared_scheme = "bf16"  # the checkpoint lists the shared MLP in the quant config's ignored layers
        elif shared == "fp8_block" and scheme == "mxfp4_w4a16" and same_pair:
            shared_scheme = "fp8_block"     # DeepSeek-V4: FP4 routed experts, block-FP8 everything else
        elif shared != scheme or not same_pair:
            return (f"shared experts ({s.w1.scheme_name()}) and routed experts ({e.w1.scheme_name()}) differ: a "
                    "vLLM model block quantizes both with the checkpoint's one config")
        elif s.w1.scale is not None and e.w1.scale is not None and s.w1.scale.dtype != e.w1.scale.dtype:
            return (f"shared experts' scales ({s.w1.scale.dtype}) and routed experts' ({e.w1.scale.dtype}) differ: "
                    "one checkpoint stores them alike")
    why = _moe_refusal(args, biases_wired=_gpt_oss_experts(args, scheme))
    if why:
        return why
    if scheme == "mxfp4_w4a16":
        return _mxfp4_moe_plan(args, shared_scheme)
    if scheme == "int4_w4a16":
        return _int4_moe_plan(args, shared_scheme)
    plan = _with_scale_dtype(_plan(cast(Scheme, scheme), "moe"), e.w1)
    act = moe_activation(args.activation)
    assert isinstance(act, MoeAct)
    if shared_scheme == "bf16":
        plan = replace(plan, shared_scheme="bf16", notes=plan.notes + (
            "shared MLP in bf16 beside quantized routed experts: the checkpoint's quant config lists it among "
            "its ignored layers, and vLLM builds such a layer with UnquantizedLinearMethod",))
    if scheme == "fp8_block" and act.vllm_name == "silu" and act.limit is not None:
        plan = replace(plan, notes=plan.notes + (
            "clamped SiLU with fp8 block: vLLM 0.26's TritonExperts fuses SiLU-and-mul with the 1x128 quant "
            "(silu_and_mul_per_block_quant, no clamp) when DeepGEMM E8M0 is off; the build refuses that case",))
    return plan


_DSV4_CONFIG = QuantConfigSpec("vllm.models.deepseek_v4.quant_config", "DeepseekV4FP8Config",
                               {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]})


def _mxfp4_moe_plan(args: MoeArgs, shared_scheme: Optional[Scheme]) -> Union[Plan, str]:
    """MXFP4 W4A16 experts as vLLM 0.26 serves DeepSeek-V4: `DeepseekV4FP8Config` (the checkpoint's
    `quant_method: fp8` with `model_type: deepseek_v4`) gives the routed experts `Mxfp4MoEMethod`
    (`expert_dtype` fp4, the default) and every linear layer block FP8 with ue8m0 scales. On sm90
    its backend oracle skips DeepGEMM-FP4 and TRT-LLM (sm100) and picks MARLIN: bf16 activations,
    the fp4 weights dequantized in the kernel, the clamp from the layer's `swiglu_limit`."""
    if _gpt_oss_experts(args, "mxfp4_w4a16"):
        return _gpt_oss_plan(args)
    gw = gate_wiring(args)
    if isinstance(gw, str) or gw.style != "deepseek_v4":
        return ("experts: MXFP4 W4A16 outside a DeepSeek-V4 or gpt-oss block: vLLM 0.26 runs it through Marlin "
                "under compressed-tensors (CompressedTensorsW4A4Mxfp4MoEMethod); this backend wires DeepSeek-V4's "
                "(DeepseekV4FP8Config → Mxfp4MoEMethod) and gpt-oss's (GptOssMxfp4Config) only")
    if shared_scheme == "bf16":
        return ("shared experts in bf16 beside DeepSeek-V4-style MXFP4 routed experts: DeepseekV4FP8Config "
                "quantizes every linear layer it is not told to skip to block FP8, and DeepSeek-V4's checkpoints "
                "quantize their shared expert; a bf16 one beside FP4 experts is not wired in this backend")
    if args.hidden % 256:
        return (f"hidden {args.hidden} with MXFP4 experts on Marlin: vLLM 0.26 pads hidden to a multiple of 256 "
                "and then calls the runner-held gate on the padded input, a shape error inside vLLM (seen on the "
                "H200: 'mat1 and mat2 shapes cannot be multiplied')")
    shared = args.shared
    if shared is not None and shared.w1.scale is not None and shared.w1.scale.dtype != "ue8m0":
        return (f"shared experts' block scales in {shared.w1.scale.dtype}: DeepSeek-V4's FP4-expert checkpoints "
                "store their FP8 scales as ue8m0 (DeepseekV4FP8Config.is_scale_e8m0)")
    notes: tuple[str, ...] = ("routed experts MXFP4 (e2m1, ue8m0 per 1x32), bf16 activations; on sm90 vLLM 0.26 pads "
             "intermediate to x128 and hidden to x256 for Marlin, the checkpoint's tensors loaded into the "
             "leading rows and columns as its weight loader does",)
    if shared_scheme == "fp8_block":
        notes += ("shared MLP block FP8 under the same config, scales stored as ue8m0 (float8_e8m0fnu)",)
    return Plan("mxfp4_w4a16", _DSV4_CONFIG, "DeepseekV4FP8Config → Mxfp4MoEMethod → MARLIN (MarlinExperts)",
                notes, weight_scale_dtype="ue8m0", shared_scheme=shared_scheme)


_GPT_OSS_CONFIG = QuantConfigSpec(f"{_QUANT}.mxfp4", "GptOssMxfp4Config", {"quant_method": "mxfp4"})


def _gpt_oss_plan(args: MoeArgs) -> Union[Plan, str]:
    """gpt-oss's MXFP4 experts: `GptOssMxfp4Config` (the checkpoint's `quant_method: mxfp4` with
    `model_type: gpt_oss`) → `GptOssMxfp4MoEMethod`, whose quant config fixes swigluoai at alpha
    1.702, limit 7 (moe_activation admits only those), with bf16 expert biases. On sm90 its
    backend oracle picks TRITON: OpenAI's triton_kernels (vendored in vLLM) as a monolithic
    kernel that routes inside (softmax top-k, renormalized)."""
    if args.routing.distribution != "natural":
        return (f"forced routing ({args.routing.name}) on gpt-oss's MXFP4 experts: on sm90 vLLM 0.26 runs them in "
                "OAITritonMxfp4ExpertsMonolithic, which routes inside its kernel, so the ids cannot be replaced")
    r = args.router
    if not r.renormalize or r.scoring != "softmax" or isinstance(r.select, GroupedTopK) \
            or (r.scale is not None and r.scale != 1.0):
        return ("gpt-oss's MXFP4 experts with a router other than plain softmax top-k, renormalized, unscaled: "
                "the monolithic triton_kernels MoE routes that way only (it ignores expert groups and a routed "
                "scale)")
    notes = ("routed experts MXFP4 (e2m1, ue8m0 per 1x32) with bf16 biases, bf16 activations; the monolithic "
             "kernel routes inside: the check takes the routing from vLLM's router on the same logits and "
             "leaves out rows whose top-k ends in a tie",)
    return Plan("mxfp4_w4a16", _GPT_OSS_CONFIG, "GptOssMxfp4Config → GptOssMxfp4MoEMethod → TRITON "
                "(OAITritonMxfp4ExpertsMonolithic)", notes)


def _int4_moe_config() -> QuantConfigSpec:
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32,
               "dynamic": False, "actorder": None}
    cfg = {"quant_method": "compressed-tensors", "format": "pack-quantized",
           "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None}}}
    return QuantConfigSpec(_CT, "CompressedTensorsConfig", cfg, requires=("compressed_tensors",))


def _int4_moe_plan(args: MoeArgs, shared_scheme: Optional[Scheme]) -> Union[Plan, str]:
    """INT4 W4A16 experts as Kimi-K2.5 ships them: compressed-tensors `pack-quantized`, symmetric
    groups of 32 along K, bf16 scales → `CompressedTensorsWNA16MarlinMoEMethod` (Marlin on sm90),
    whose parameters hold each matrix transposed ([K/8, N] packed, [K/32, N] scales)."""
    if args.hidden % 128:       # the intermediate size is a multiple of the group (32): the case format checks
        return (f"INT4 experts with hidden {args.hidden}: vLLM 0.26's Marlin MoE needs hidden x128 "
                "(check_moe_marlin_supports_layer), else compressed-tensors picks its Triton WNA16 method, not "
                "wired in this backend")
    if shared_scheme is None and args.shared is not None:
        return ("an INT4 shared expert: Kimi-K2.5's checkpoint leaves its shared MLP in bf16; an INT4 shared MLP "
                "(a compressed-tensors WNA16 linear) is not wired in this backend")
    notes: tuple[str, ...] = ("routed experts INT4 (symmetric, bf16 scale per 1x32 along K), bf16 activations",)
    if shared_scheme == "bf16":
        notes += ("shared MLP in bf16, as the checkpoint's ignore list leaves it",)
    return Plan("int4_w4a16", _int4_moe_config(), "CompressedTensorsWNA16MarlinMoEMethod → MarlinExperts", notes,
                shared_scheme=shared_scheme)
