"""The vllm GEMM backend: vLLM's `ReplicatedLinear` under the quant config the descriptors imply.

prepare (untimed): build the layer under the config (quant_map), load synthetic weights in the
checkpoint's format, run `process_weights_after_loading`, run once, capture a CUDA graph when
vLLM would replay one (M ≤ its largest capture size). fn (timed): the layer's forward on a bf16
input, so vLLM quantizes the activation, picks and runs its kernel as in serving.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any, Optional

from operatorx.backends.base import Check, Prepared
from operatorx.backends.ranked import RankComm, RankPrepared
from operatorx.backends.vllm import quant_map
from operatorx.backends.vllm.common import VllmBackendBase
from operatorx.spec import Case, GemmArgs

__all__ = ["VllmGemm", "CHECK_ROWS", "BOUND"]

CHECK_ROWS = 256
#: ||out - ref|| / ||ref||: bf16 output rounding, plus the activation's fp8 rounding when the
#: reference's emulated quantization and vLLM's differ at ties.
BOUND = {"bf16": 1e-2, "fp8": 1.5e-2}


class VllmGemm(VllmBackendBase):
    op_type = "gemm"
    plan_of = staticmethod(quant_map.gemm_plan)

    def prepare(self, case: Case, device: str) -> Prepared:
        args = case.args
        assert isinstance(args, GemmArgs)
        plan = self.plan_or_refuse(case)
        from operatorx.backends.vllm.gemm_build import build_linear

        built, stack = self.build_in_stack(lambda stack: build_linear(case, args, plan, stack))
        return _prepared(args, plan, built, stack)

    def supports_ranks(self, case: Case, device: str, world: int) -> Optional[str]:
        """The single-device refusals, then the split's (backends/vllm/ranks.py)."""
        from operatorx.backends.vllm.ranks import gemm_rank_refusal

        return self.supports(case, device) or gemm_rank_refusal(case, world)

    def prepare_ranks(self, case: Case, device: str, comm: RankComm) -> RankPrepared:
        """This rank's ColumnParallelLinear / RowParallelLinear / ReplicatedLinear of the case."""
        from operatorx.backends.vllm.env import VllmEnv
        from operatorx.backends.vllm.gemm_build import LinearSplit, build_linear
        from operatorx.backends.vllm.ranks import gemm_collectives, linear_split, rank_setup, ranked

        args = case.args
        assert isinstance(args, GemmArgs)
        plan = self.plan_or_refuse(case)
        kind, rule = linear_split(case)
        VllmEnv.for_ranks(rank_setup(case, comm))
        split = LinearSplit(kind, comm.rank, comm.world)
        built, stack = self.build_in_stack(lambda stack: build_linear(case, args, plan, stack, split))
        built.metadata["rank_layer"]["rule"] = rule
        return ranked(_prepared(args, plan, built, stack), case, comm, gemm_collectives(kind, comm.world))


def _prepared(args: GemmArgs, plan: quant_map.Plan, built: Any, stack: ExitStack) -> Prepared:
    from operatorx.backends.vllm.reference import ACT_FLAVORS, act_quant_dequant, best_flavor

    state: dict[str, Any] = {"built": built}

    def fn() -> Any:
        return state["built"].timed()

    def check() -> Check:
        b = state["built"]
        rows = min(args.m, CHECK_ROWS)
        out = fn()[:rows].float()
        x = (b.ref_x if b.ref_x is not None else b.x)[:rows]
        w = b.weight.dequant()

        def activation(flavor: str) -> Any:
            """The input as the kernels see it: each rank quantizes its own K slice (row-parallel)."""
            if b.k_parts == 1:
                return act_quant_dequant(x, plan.scheme, flavor, b.input_scale)
            import torch

            return torch.cat([act_quant_dequant(part.contiguous(), plan.scheme, flavor, b.input_scale)
                              for part in x.chunk(b.k_parts, dim=1)], dim=1)

        def reference(flavor: str) -> Any:
            ref = activation(flavor) @ w.T
            if b.bias is not None:
                ref = ref + b.bias.float()
            return ref

        err, flavor = best_flavor(out, plan.scheme, reference)
        b.metadata["activation_scales_used"] = flavor
        bound = BOUND["bf16" if plan.scheme == "bf16" else "fp8"]
        quant = "" if plan.scheme == "bf16" else f", activation quantized as vLLM does ({flavor} scales; " \
            f"tried {list(ACT_FLAVORS[plan.scheme])})"
        graph = " (output of the CUDA-graph replay)" if b.graph is not None else ""
        ranks = f", against the output combined over {b.k_parts} ranks" if b.k_parts > 1 else ""
        return Check(err, bound, rows, f"fp32 matmul of the dequantized checkpoint weight{quant}{graph}{ranks}")

    def release() -> None:
        state.clear()
        stack.close()

    return Prepared(fn=fn, check=check, metadata=built.metadata, release=release, layers=_layers(built))


def _layers(built: Any) -> dict[str, Any]:
    """Deeper entry points for `--host`: the layer's eager forward (when the timed call is a graph
    replay) and its quant method's `apply`, which skips the module call and its hooks."""
    layer, x = built.layer, built.x
    out: dict[str, Any] = {}
    if built.graph is not None:
        out["layer.forward"] = built.eager
    bias = getattr(layer, "bias", None)
    out["quant_method.apply"] = lambda: layer.quant_method.apply(layer, x, bias)
    return out
