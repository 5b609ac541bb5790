"""Build one vLLM `ReplicatedLinear` for a gemm case (imports vLLM; called from gemm.py)."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from operatorx.backends.base import Unsupported
from operatorx.backends.torch.memory import require_memory
from operatorx.backends.vllm.common import built_metadata, kernel_of_linear, vllm_refusals
from operatorx.backends.vllm.env import VllmEnv, build_quant_config
from operatorx.backends.vllm.graphs import CapturedCall, GraphOrEager, capture, eager_kernel_names, graph_size
from operatorx.backends.vllm.quant_map import Plan
from operatorx.backends.vllm.weights import (
    QuantMatrix,
    load_params,
    param_summary,
    quantize_matrix,
    scale_name,
    static_input_scale,
)
from operatorx.spec import Case, GemmArgs

__all__ = ["BuiltLinear", "build_linear"]


@dataclass
class BuiltLinear(GraphOrEager):
    layer: Any
    x: torch.Tensor
    weight: QuantMatrix
    bias: Optional[torch.Tensor]
    input_scale: Optional[torch.Tensor]
    graph: Optional[CapturedCall] = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def eager(self) -> torch.Tensor:
        return self.layer(self.x)


def _device_bytes(args: GemmArgs) -> int:
    m, n, k = args.m, args.n, args.k
    return m * k * 2 + n * k * (1 + 2 + 4) + m * n * 2 * 3 + min(m, 256) * (n + k) * 4 + (1 << 28)


def build_linear(case: Case, args: GemmArgs, plan: Plan, stack: ExitStack) -> BuiltLinear:
    require_memory(_device_bytes(args), "cuda")
    env = VllmEnv.get()
    stack.enter_context(env.case_scope())
    from vllm.model_executor.layers.linear import ReplicatedLinear

    with vllm_refusals(f"the quant config {plan.quant.cls if plan.quant else None}", construction=True):
        quant_config = build_quant_config(plan.quant)
    prefix = env.unique_prefix("linear")
    with vllm_refusals("to build ReplicatedLinear", construction=True), torch.device("cuda"):
        layer = ReplicatedLinear(args.k, args.n, bias=bool(args.bias), quant_config=quant_config, prefix=prefix,
                                 return_bias=False, disable_tp=True)
    selected = kernel_of_linear(layer)
    if plan.quantized and selected["quant_method"] == "UnquantizedLinearMethod":
        raise Unsupported(f"vLLM built the layer unquantized under {plan.quant.cls if plan.quant else '-'} "
                          f"for {args.b.scheme_name()}; timing bf16 in its place would be another op")

    gen = torch.Generator(device="cuda").manual_seed(case.seed())
    x = torch.randn(args.m, args.k, generator=gen, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(args.n, args.k, generator=gen, device="cuda", dtype=torch.bfloat16) / args.k ** 0.5
    weight = quantize_matrix(w, plan.scheme, scale_dtype=plan.weight_scale_dtype)
    del w
    tensors: dict[str, torch.Tensor] = {"weight": weight.q}
    if weight.scale is not None:
        tensors[scale_name(plan.scheme) or "weight_scale"] = weight.scale
    input_scale = static_input_scale(x) if plan.scheme == "fp8_tensor_static" else None
    if input_scale is not None:
        tensors["input_scale"] = input_scale
    bias = None
    if args.bias:
        bias = torch.randn(args.n, generator=gen, device="cuda", dtype=torch.bfloat16)
        tensors["bias"] = bias
    before = param_summary(layer)
    load_params(layer, tensors, "ReplicatedLinear")
    with vllm_refusals("process_weights_after_loading", construction=True):
        layer.quant_method.process_weights_after_loading(layer)
    after = param_summary(layer)
    selected = kernel_of_linear(layer)            # some methods pick or swap the kernel at PWAL

    built = BuiltLinear(layer, x, weight, bias, input_scale)
    with vllm_refusals(f"the forward ({selected['kernel']})", construction=False):
        built.eager()
        torch.cuda.synchronize()
    size = graph_size(args.m, env.capture_sizes)
    if size is not None:
        built.graph = capture(built.eager)
    built.metadata = _metadata(args, plan, selected, before, after, size, env)
    if built.graph is not None:
        built.metadata["eager_kernels"] = eager_kernel_names(built.eager)
    return built


def _metadata(args: GemmArgs, plan: Plan, selected: dict[str, Any], before: dict[str, str],
              after: dict[str, str], size: Optional[int], env: VllmEnv) -> dict[str, Any]:
    meta: dict[str, Any] = {
        **built_metadata("vllm.model_executor.layers.linear.ReplicatedLinear", plan, before, after, size, env),
        **selected,
        "synthetic_weights": "random N(0, 1/K), quantized to the checkpoint format",
    }
    if plan.scheme == "fp8_block":
        meta["deep_gemm_e8m0"] = _safe(_deep_gemm_e8m0)
    if size is not None and size != args.m:
        meta["graph_note"] = f"vLLM would pad M={args.m} to its captured size {size}; timed at M={args.m}"
    if plan.notes:
        meta["notes"] = list(plan.notes)
    return meta


def _deep_gemm_e8m0() -> bool:
    from vllm.utils.deep_gemm import is_deep_gemm_e8m0_used

    return bool(is_deep_gemm_e8m0_used())


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception as err:  # noqa: BLE001
        return f"unknown ({type(err).__name__})"
