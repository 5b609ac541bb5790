"""What every vllm attention backend shares: the refusal order, the prepared case and its check.

The rule: `supports` asks the op's own refusal first (by field), then the device, then whether vLLM
imports; `prepare` builds inside one ExitStack (closed on failure, or by the Prepared's release), times
the built module's graph replay or eager call, and checks the reference requests' rows of one more call
against the op's fp32 reference on the same weights, inputs and cache contents. A subclass names its
op type, its refusal, its build and its reference: one module per op, as the op-type interface asks.
Importing this module does not import vLLM.
"""

from __future__ import annotations

import gc
from contextlib import ExitStack
from typing import Any, ClassVar, Optional, Protocol

import torch

from operatorx.backends.base import Check, Prepared, Unsupported
from operatorx.spec import Case
from operatorx.spec.op_type import OpArgs

__all__ = ["BuiltAttention", "Reference", "VllmAttentionBackend", "with_topk_overlap"]


class Reference(Protocol):
    """What an fp32 reference returns: the layout rows it checks, their output, what it computed."""

    @property
    def rows(self) -> torch.Tensor: ...

    @property
    def out(self) -> torch.Tensor: ...

    @property
    def what(self) -> str: ...


class _Described:
    """A Reference with its description extended."""

    def __init__(self, rows: torch.Tensor, out: torch.Tensor, what: str):
        self.rows, self.out, self.what = rows, out, what


def with_topk_overlap(ref: Any, metadata: dict[str, Any]) -> Reference:
    """A sparse reference that attended vLLM's own picks (`ref.used_indices`) beside its own top-k
    (`ref.own_indices`), described with how much of vLLM's selection its own holds (worst request), the
    figures in metadata["topk_overlap"]: the check compares the attention, the overlap the selection."""
    from operatorx.backends.torch.attention.dsa_reference import overlap

    shares = [overlap(own.cpu(), used.cpu()) for own, used in zip(ref.own_indices, ref.used_indices, strict=True)]
    worst = min(shares) if shares else 1.0
    metadata["topk_overlap"] = {"min": worst, "mean": sum(shares) / len(shares) if shares else 1.0,
                                "vllm_picks_after_their_token": ref.invalid_picks}
    return _Described(ref.rows, ref.out, f"{ref.what}; the reference's own top-k holds {worst:.3f} (worst request) "
                                         f"of vLLM's picks; {ref.invalid_picks} of vLLM's picks are after their token")


class BuiltAttention(Protocol):
    """What a build hands the backend (BuiltGqa, BuiltMla, ...)."""

    graph: Any
    metadata: dict[str, Any]

    def eager(self) -> Any: ...

    def timed(self) -> Any: ...

    def in_layout_order(self, out: torch.Tensor) -> torch.Tensor: ...


class VllmAttentionBackend:
    """One attention op type through vLLM's own module (module docstring)."""

    name = "vllm"
    op_type: ClassVar[str]
    #: How the check read the cache back, for its description (cache_read's default).
    CACHE_READ: ClassVar[str]

    def refusal(self, args: OpArgs) -> Optional[str]:
        """None when this backend can build the case (vLLM and the device aside); else why, by field."""
        raise NotImplementedError

    def build(self, case: Case, args: Any, stack: ExitStack) -> BuiltAttention:
        """The module, its filled cache and metadata, the timed call (imports vLLM)."""
        raise NotImplementedError

    def reference(self, args: Any, built: Any, flavor: str) -> Reference:
        """The fp32 reference of the same module on the built case's weights, inputs and cache, its
        projections' activations quantized as `flavor` says (proj.activation)."""
        raise NotImplementedError

    def bound(self, args: Any) -> float:
        """The check's ||out - ref|| / ||ref|| bound for the case."""
        raise NotImplementedError

    def cache_read(self, args: Any) -> str:
        """How the check read the case's cache back, as its description says it."""
        return self.CACHE_READ

    def check(self, args: Any, b: Any, fn: Any) -> Check:
        """One call of `fn` against the reference under each activation-scale flavor vLLM may have used
        (proj.flavors of the built case's projection plan, `b.plan`); the closest one is the check."""
        from operatorx.backends.check import rel_error
        from operatorx.backends.vllm.attention.proj import flavors

        out = b.in_layout_order(fn())
        best: Optional[tuple[float, str, Reference]] = None
        for flavor in flavors(b.plan):
            ref = self.reference(args, b, flavor)
            err = rel_error(out[ref.rows.to(out.device)], ref.out)
            if best is None or err < best[0]:
                best = (err, flavor, ref)
        assert best is not None
        err, flavor, ref = best
        graph = "; output of the CUDA-graph replay" if b.graph is not None else ""
        scales = "" if flavor == "none" else f"; {b.plan.scheme} activations quantized with {flavor} scales"
        what = f"{ref.what}; {self.cache_read(args)}{graph}{scales}"
        return Check(err, self.bound(args), int(ref.rows.numel()), what)

    def supports(self, case: Case, device: str) -> Optional[str]:
        why = self.refusal(case.args)
        if why is not None:
            return why
        if device != "cuda":
            return f"device {device!r}: the vllm backend runs on CUDA GPUs"
        from operatorx.backends.vllm.env import vllm_missing

        return vllm_missing()

    def prepare(self, case: Case, device: str) -> Prepared:
        args = case.args
        why = self.supports(case, device)
        if why is not None:
            raise Unsupported(why)
        from operatorx.backends.vllm.common import VllmBackendBase
        from operatorx.backends.vllm.env import VllmEnv

        def build(stack: ExitStack) -> BuiltAttention:
            # first in, so last out: the workspace vLLM's attention kernels grew (FlashMLA's V4 prefill
            # gather, the sparse indexer's) goes back after the module, on release or a failed build, once
            # no other live case (a placement copy) replays views of it
            stack.callback(VllmEnv.get().hold_workspace())
            return self.build(case, args, stack)

        built, stack = VllmBackendBase.build_in_stack(build)
        state: dict[str, Any] = {"built": built}

        def fn() -> Any:
            return state["built"].timed()

        def check() -> Check:
            return self.check(args, state["built"], fn)

        layers: dict[str, Any] = {"module.forward": built.eager} if built.graph is not None else {}

        def release() -> None:
            layers.clear()
            state.clear()
            stack.close()
            gc.collect()          # vLLM modules sit in reference cycles (see moe.py's release)

        return Prepared(fn=fn, check=check, metadata=built.metadata, release=release, layers=layers)
