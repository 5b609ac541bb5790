"""Small pieces both vllm backends use: seeds, vLLM's refusals, names of what vLLM selected."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Optional

from operatorx.backends.base import Unsupported
from operatorx.backends.refusal import library_refusal
from operatorx.spec import Case

__all__ = ["case_seed", "vllm_refusals", "class_name", "kernel_of_linear", "describe_custom_ops"]


def case_seed(case: Case) -> int:
    return int(hashlib.sha256(case.key().encode()).hexdigest()[:8], 16)


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
