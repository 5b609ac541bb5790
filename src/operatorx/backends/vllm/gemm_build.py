"""Build one vLLM linear layer for a gemm case (imports vLLM; called from gemm.py and gemm_ranks.py).

One device: `ReplicatedLinear`. A rank of a multi-rank case: the layer the role's split names, as
vLLM's model code builds it under TP (`ColumnParallelLinear`, `RowParallelLinear` with
`input_is_parallel` and `reduce_results`; `ReplicatedLinear` for replicated roles); the whole
checkpoint tensors go through each parameter's own `weight_loader`, which keeps this rank's shard,
as vLLM's checkpoint loader does."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from operatorx.backends.base import Unsupported
from operatorx.backends.torch.memory import require_memory
from operatorx.backends.vllm.common import built_metadata, kernel_of_linear, vllm_refusals
from operatorx.backends.vllm.env import VllmEnv, build_quant_config
from operatorx.backends.vllm.graphs import CapturedCall, GraphOrEager, capture_for, eager_kernel_names, graph_size
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

__all__ = ["BuiltLinear", "LinearSplit", "build_linear"]


@dataclass(frozen=True)
class LinearSplit:
    """How this rank's layer splits the GEMM: `column` (N), `row` (K) or `replicated`, over `world` ranks."""

    kind: str
    rank: int
    world: int

    def k_range(self, k: int) -> tuple[int, int]:
        """The input columns this rank holds (row-parallel), else all of them."""
        if self.kind != "row":
            return 0, k
        part = k // self.world
        return self.rank * part, (self.rank + 1) * part


@dataclass
class BuiltLinear(GraphOrEager):
    layer: Any
    x: torch.Tensor
    weight: QuantMatrix
    bias: Optional[torch.Tensor]
    input_scale: Optional[torch.Tensor]
    graph: Optional[CapturedCall] = None
    metadata: dict[str, Any] = field(default_factory=dict)
    ref_x: Optional[torch.Tensor] = None
    """The whole layer's input when this rank's `x` is its K slice (row-parallel); else None."""
    k_parts: int = 1
    """The K slices the ranks quantize their activations in apart (row-parallel: the world)."""

    def eager(self) -> torch.Tensor:
        return self.layer(self.x)


def _device_bytes(args: GemmArgs) -> int:
    m, n, k = args.m, args.n, args.k
    return m * k * 2 + n * k * (1 + 2 + 4) + m * n * 2 * 3 + min(m, 256) * (n + k) * 4 + (1 << 28)


_LAYER_CLASS = {"column": "ColumnParallelLinear", "row": "RowParallelLinear", "replicated": "ReplicatedLinear"}


def _make_layer(args: GemmArgs, quant_config: Any, prefix: str, split: Optional[LinearSplit]) -> Any:
    from vllm.model_executor.layers import linear

    kind = split.kind if split is not None else "replicated"
    common = {"bias": bool(args.bias), "quant_config": quant_config, "prefix": prefix, "return_bias": False}
    if kind == "column":        # gathered, as the torch backend's tp GEMM: one [M, N] output to check
        return linear.ColumnParallelLinear(args.k, args.n, gather_output=True, **common)
    if kind == "row":
        return linear.RowParallelLinear(args.k, args.n, input_is_parallel=True, reduce_results=True, **common)
    return linear.ReplicatedLinear(args.k, args.n, disable_tp=split is None, **common)


def _load_with_loaders(layer: Any, tensors: dict[str, torch.Tensor], what: str) -> None:
    """Each whole checkpoint tensor through its parameter's `weight_loader` (which keeps this rank's shard)."""
    params = dict(layer.named_parameters(recurse=False))
    missing = sorted(set(params) - set(tensors))
    extra = sorted(set(tensors) - set(params))
    if missing or extra:
        raise RuntimeError(f"{what}: checkpoint tensors {extra or '-'} have no parameter, parameters {missing or '-'} "
                           "got no tensor")
    for name, t in tensors.items():
        p = params[name]
        loader = getattr(p, "weight_loader", None)
        if loader is None:
            raise RuntimeError(f"{what}.{name}: the parameter has no weight_loader")
        loader(p, _same_ndim(t, p))


def _same_ndim(t: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """A scale stored with fewer or more trailing unit dims than vLLM registered ([N] for [N, 1]):
    reshaped so the loader can cut it along the parameter's own dims."""
    if t.dim() < p.dim() and all(d == 1 for d in p.shape[t.dim():]):
        return t.reshape(tuple(t.shape) + (1,) * (p.dim() - t.dim()))
    if t.dim() > p.dim() and all(d == 1 for d in t.shape[p.dim():]):
        return t.reshape(tuple(t.shape[:p.dim()]))
    return t


def build_linear(case: Case, args: GemmArgs, plan: Plan, stack: ExitStack,
                 split: Optional[LinearSplit] = None) -> BuiltLinear:
    """The case's layer; `split` for a rank of a multi-rank case (None: one device)."""
    require_memory(_device_bytes(args), "cuda")
    env = VllmEnv.get()
    stack.enter_context(env.case_scope())
    cls = _LAYER_CLASS[split.kind if split is not None else "replicated"]

    with vllm_refusals(f"the quant config {plan.quant.cls if plan.quant else None}", construction=True):
        quant_config = build_quant_config(plan.quant)
    prefix = env.unique_prefix("linear")
    with vllm_refusals(f"to build {cls}", construction=True), torch.device("cuda"):
        layer = _make_layer(args, quant_config, prefix, split)
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
    if split is None:
        load_params(layer, tensors, cls)
    else:
        with vllm_refusals(f"to load {cls}'s shard", construction=True):
            _load_with_loaders(layer, tensors, cls)
    with vllm_refusals("process_weights_after_loading", construction=True):
        layer.quant_method.process_weights_after_loading(layer)
    after = param_summary(layer)
    selected = kernel_of_linear(layer)            # some methods pick or swap the kernel at PWAL

    built = BuiltLinear(layer, x, weight, bias, input_scale)
    if split is not None and split.kind == "row":
        lo, hi = split.k_range(args.k)
        built.ref_x, built.x, built.k_parts = x, x[:, lo:hi].contiguous(), split.world
    with vllm_refusals(f"the forward ({selected['kernel']})", construction=False):
        built.eager()
        torch.cuda.synchronize()
    size = graph_size(args.m, env.capture_sizes)
    if size is not None:
        built.graph = capture_for(built.eager, split.world if split is not None else 1)
    built.metadata = _metadata(args, plan, selected, before, after, size, env, cls)
    if split is not None:
        lo, hi = split.k_range(args.k)
        built.metadata["rank_layer"] = {"class": f"vllm.model_executor.layers.linear.{cls}", "split": split.kind,
                                        "rank": split.rank, "world": split.world,
                                        "gather_output": split.kind == "column",
                                        "input_k": [lo, hi], "tp_all_reduce": env.tp_all_reduce()}
    if built.graph is not None:
        built.metadata["eager_kernels"] = eager_kernel_names(built.eager)
    return built


def _metadata(args: GemmArgs, plan: Plan, selected: dict[str, Any], before: dict[str, str],
              after: dict[str, str], size: Optional[int], env: VllmEnv, cls: str) -> dict[str, Any]:
    meta: dict[str, Any] = {
        **built_metadata(f"vllm.model_executor.layers.linear.{cls}", plan, before, after, size, env),
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
