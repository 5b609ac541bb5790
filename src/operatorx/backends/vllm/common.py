"""Small pieces both vllm backends use: seeds, vLLM's refusals, names of what vLLM selected."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, Optional

from operatorx.backends.base import Unsupported
from operatorx.backends.refusal import library_refusal
from operatorx.spec import Case

__all__ = ["VllmBackendBase", "built_metadata", "vllm_refusals", "class_name", "kernel_of_linear",
           "describe_custom_ops", "describe_ir_priority"]


@contextmanager
def vllm_refusals(what: str, construction: bool) -> Iterator[None]:
    """Turn vLLM's own "no kernel for this" into Unsupported with its message.

    While building a layer, vLLM validates configs with ValueError/NotImplementedError: those are
    its refusals. A TypeError or AttributeError is an API mismatch (a bug here): it propagates.
    """
    try:
        yield
    except Unsupported:
        raise
    except (ValueError, NotImplementedError, AssertionError) as err:
        reason = library_refusal(err)
        if reason is None and construction and not isinstance(err, AssertionError):
            reason = str(err).strip().splitlines()[0][:400] if str(err).strip() else type(err).__name__
        if reason is None:
            raise
        raise Unsupported(f"vLLM refused {what}: {reason}") from err
    except RuntimeError as err:
        reason = library_refusal(err)
        if reason is None:
            raise
        raise Unsupported(f"vLLM refused {what}: {reason}") from err


def class_name(obj: Any) -> Optional[str]:
    return None if obj is None else type(obj).__name__


def kernel_of_linear(layer: Any) -> dict[str, Optional[str]]:
    """The quant method and the kernel object vLLM chose for a linear layer (by class name)."""
    qm = getattr(layer, "quant_method", None)
    scheme = getattr(layer, "scheme", None)          # compressed-tensors keeps the kernel on the scheme
    holder = scheme if scheme is not None else qm
    kernel = None
    for attr in ("fp8_linear", "kernel", "w8a8_block_fp8_linear", "linear_kernel"):
        kernel = getattr(holder, attr, None)
        if kernel is not None:
            break
    out = {"quant_method": class_name(qm), "scheme": class_name(scheme), "kernel": class_name(kernel)}
    if class_name(qm) == "UnquantizedLinearMethod":
        out["kernel"] = "torch.nn.functional.linear (UnquantizedLinearMethod)"
    quant_op = getattr(kernel, "quant_fp8", None) or getattr(kernel, "input_quant_op", None)
    if quant_op is not None:
        out["activation_quant_op"] = class_name(quant_op)
    return out


def describe_custom_ops(config: Any) -> Any:
    try:
        return list(config.compilation_config.custom_ops)
    except Exception:  # noqa: BLE001
        return None


def describe_ir_priority(config: Any) -> Any:
    """Which implementation each vLLM IR op dispatches to, in priority order (None: no IR ops)."""
    try:
        from dataclasses import asdict

        return asdict(config.kernel_config.ir_op_priority)
    except Exception:  # noqa: BLE001
        return None


class VllmBackendBase:
    """What the vllm gemm and moe backends share: the quant plan decides, then vLLM must be there.

    A subclass sets `op_type` and `plan_of(args)` (quant_map's plan, or a reason string).
    """

    name = "vllm"
    op_type: str

    @staticmethod
    def plan_of(args: Any) -> Any:
        raise NotImplementedError

    def supports(self, case: Case, device: str) -> Optional[str]:
        plan = self.plan_of(case.args)
        if isinstance(plan, str):
            return plan
        if device != "cuda":
            return f"device {device!r}: the vllm backend runs on CUDA GPUs"
        from operatorx.backends.vllm.env import vllm_missing

        return vllm_missing()

    def plan_or_refuse(self, case: Case) -> Any:
        """The plan for a case about to be prepared; Unsupported when there is none or no vLLM."""
        from operatorx.backends.vllm.env import vllm_missing

        plan = self.plan_of(case.args)
        if isinstance(plan, str):
            raise Unsupported(plan)
        why = vllm_missing()
        if why:
            raise Unsupported(why)
        return plan

    @staticmethod
    def build_in_stack(build: Callable[[ExitStack], Any]) -> tuple[Any, ExitStack]:
        """Run `build` with a fresh ExitStack (vLLM config, default dtype, forward context);
        on failure the stack is closed here, on success the Prepared's release closes it."""
        stack = ExitStack()
        try:
            return build(stack), stack
        except BaseException:
            stack.close()
            raise


def built_metadata(layer: str, plan: Any, before: dict[str, str], after: dict[str, str], size: Optional[int],
                   env: Any) -> dict[str, Any]:
    """What every vllm row records about the layer it built: config, parameters, selection
    environment, custom ops and whether the timed call is a CUDA-graph replay."""
    from operatorx.backends.vllm.env import selection_env, vllm_version

    return {
        "framework": f"vllm {vllm_version()}",
        "layer": layer,
        "quant_config": plan.quant.to_json() if plan.quant else None,
        "scheme": plan.scheme,
        "expected_sm90": plan.expected_sm90,
        "params_before_loading": before,
        "params_after_loading": after,
        "env": selection_env(),
        "custom_ops": describe_custom_ops(env.config),
        "ir_op_priority": describe_ir_priority(env.config),
        "cuda_graph": size is not None,
        "vllm_graph_size": size,
        "max_capture_size": max(env.capture_sizes),
    }
