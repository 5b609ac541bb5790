"""The torch MoE backend: Router → (forced routing) → Experts (permute, grouped GEMMs, combine)
→ + shared experts, composed from small parts (vLLM's modular-MoE split).

`MoeLayer.__call__` is the timed call: router GEMM to the combined output. `prepare` does
everything else: refusals, the memory check, weights, the routing histogram, the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Optional

import torch
import torch.nn.functional as F

from operatorx.backends.base import Check, Prepared, Unsupported
from operatorx.backends.check import CHECK_ROWS
from operatorx.backends.ranked import RankComm, RankPrepared
from operatorx.backends.refusal import library_refusal
from operatorx.backends.torch.memory import require_memory
from operatorx.backends.torch.moe import build, support
from operatorx.backends.torch.moe.experts import GroupedExperts
from operatorx.backends.torch.moe.reference import check_layer
from operatorx.backends.torch.moe.router import RouterOutput, TorchRouter
from operatorx.backends.torch.moe.routing import forced_ids, load_histogram
from operatorx.backends.torch.moe.shared import SharedExperts
from operatorx.backends.torch.quant import torch_dtype
from operatorx.spec import Case
from operatorx.spec.moe import MoeArgs

__all__ = ["TorchMoe", "MoeLayer", "build_layer"]



def _profiler_range(name: str) -> AbstractContextManager[Any]:
    return torch.profiler.record_function(name)


def _no_range(name: str) -> AbstractContextManager[Any]:
    return nullcontext()


class MoeLayer:
    """Composition only: each part is swappable; `ranges=True` wraps stages in profiler ranges."""

    def __init__(self, args: MoeArgs, x: torch.Tensor, router: TorchRouter, experts: GroupedExperts,
                 shared: Optional[SharedExperts], latent: Optional[build.LatentWeights], ranges: bool = False):
        self.args, self.x, self.router, self.experts = args, x, router, experts
        self.shared, self.latent = shared, latent
        self.out_dtype = torch_dtype(args.out)
        self.stage: Callable[[str], AbstractContextManager[Any]] = _no_range
        self.ranges = ranges

    @property
    def ranges(self) -> bool:
        return self.stage is _profiler_range

    @ranges.setter
    def ranges(self, on: bool) -> None:
        """The layer and its experts share a plain function, never a bound method of the layer: the
        experts holding one would make a reference cycle, and a released case's weights would stay
        allocated until some later garbage collection."""
        self.stage = self.experts.stage = _profiler_range if on else _no_range

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, RouterOutput]:
        with self.stage("moe/router"):
            r = self.router(x)
        x_e = x
        if self.latent is not None:
            with self.stage("moe/latent_down"):
                x_e = F.linear(x, self.latent.down)
                if self.latent.norm is not None:
                    x_e = F.rms_norm(x_e, (x_e.shape[-1],), self.latent.norm, eps=1e-6)
        y = self.experts(x_e, r.ids, r.weights)
        if self.latent is not None:
            with self.stage("moe/latent_up"):
                y = F.linear(y.to(x.dtype), self.latent.up).float()
        if self.shared is not None:
            with self.stage("moe/shared"):
                y = y + self.shared(x).float()
        with self.stage("moe/output"):
            return y.to(self.out_dtype), r

    def __call__(self) -> torch.Tensor:
        return self.forward(self.x)[0]


def build_layer(case: Case, device: str, ranges: bool = False) -> MoeLayer:
    """Allocate and wire one layer (no refusal checks; `TorchMoe.prepare` does those first)."""
    args = case.args
    assert isinstance(args, MoeArgs)
    e = args.experts
    gen = torch.Generator(device=device).manual_seed(case.seed())
    routable = e.num + (e.zero or 0)
    x = torch.randn(args.tokens, args.hidden, generator=gen, device=device, dtype=torch.bfloat16)
    forced = forced_ids(args.routing, args.tokens, routable, e.top_k)
    router = TorchRouter(args.router, e.top_k, build.router_weights(args, device, gen),
                         forced.to(device) if forced is not None else None)
    ids = router(x).ids                                  # the routing every call will take
    hit = sorted(i for i in torch.unique(ids).tolist() if i < e.held)
    scheme = support.experts_scheme(args, device)
    fp8 = (e.a1.scale, e.a2.scale) if scheme == "fp8_rowwise" else None
    experts = GroupedExperts(build.expert_weights(args, hit, device, gen), args.activation,
                             bool(args.router.weight_on_input), bool(e.zero), fp8,  # type: ignore[arg-type]
                             remote=e.held < e.num)
    shared = None
    if args.shared is not None:
        s_fp8 = (args.shared.a1.scale, args.shared.a1.scale) if support.shared_scheme(args, device) == "fp8_rowwise" \
            else None
        sw = build.shared_weights(args, device, gen)
        assert sw is not None
        shared = SharedExperts(sw, args.activation, s_fp8)  # type: ignore[arg-type]
    return MoeLayer(args, x, router, experts, shared, build.latent_weights(args, device, gen), ranges)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class TorchMoe:
    name = "torch"
    op_type = "moe"

    def supports(self, case: Case, device: str) -> Optional[str]:
        args = case.args
        assert isinstance(args, MoeArgs)
        return support.refusal(args, device)

    def supports_ranks(self, case: Case, device: str, world: int) -> Optional[str]:
        """The multi-rank refusals (backends/torch/moe/parallel.py: the layer's and one rank's share's)."""
        from operatorx.backends.torch.moe.parallel import moe_rank_refusal

        return moe_rank_refusal(case, device, world)

    def prepare_ranks(self, case: Case, device: str, comm: RankComm) -> RankPrepared:
        """This rank's share of a tp / tp·ep / dp·ep layer, its collectives inside the call."""
        from operatorx.backends.torch.moe.parallel import prepare_moe_ranks

        return prepare_moe_ranks(case, device, comm)

    def prepare(self, case: Case, device: str) -> Prepared:
        args = case.args
        assert isinstance(args, MoeArgs)
        require_memory(build.device_bytes(args, min(args.tokens, CHECK_ROWS)), device)
        layer = build_layer(case, device)
        try:
            out, routed = layer.forward(layer.x)
            _sync(device)
        except (RuntimeError, NotImplementedError, ValueError) as err:
            reason = library_refusal(err)
            if reason is None:
                raise
            raise Unsupported(f"torch refused the MoE layer ({layer.experts.kernel}): {reason}") from err
        meta = self._metadata(args, layer, routed)
        hit = meta["experts_hit"]
        state: dict[str, Any] = {"layer": layer}

        def fn() -> torch.Tensor:
            return state["layer"]()

        def check() -> Check:
            lay = state["layer"]
            out_, routed_ = lay.forward(lay.x)
            return check_layer(lay, out_, routed_, CHECK_ROWS)

        del out
        return Prepared(fn=fn, check=check, metadata=meta, release=state.clear,
                        min_bytes=args.min_bytes(experts_hit=hit))

    @staticmethod
    def _metadata(args: MoeArgs, layer: MoeLayer, routed: RouterOutput) -> dict[str, Any]:
        e = args.experts
        routable = e.num + (e.zero or 0)
        load = load_histogram(routed.ids, routable)
        hit = sum(1 for c in load[:e.held] if c)
        sel = args.router.select
        calls: dict[str, Any] = {
            "router": f"{'torch.mm(out_dtype=fp32)' if layer.router.mm_out_dtype else 'torch.nn.functional.linear'}"
                      f" ({args.router.gate.dtype} gate) + {args.router.scoring} + {sel.kind}",
            "permute": "torch.sort(stable) + torch.searchsorted + index_select",
            "experts": layer.experts.kernel,
            "activation": args.activation.kind,
            "combine": "index_copy_ + torch.bmm (fp32)" if not args.router.weight_on_input else "index_copy_ + sum",
        }
        if layer.shared is not None:
            calls["shared"] = layer.shared.kernel
        if layer.latent is not None:
            calls["latent"] = "torch.nn.functional.linear (bf16 down/up)"
        return {
            "calls": calls,
            "routing": {"distribution": args.routing.name, "seed": args.routing.seed,
                        "forced": layer.router.forced is not None},
            "expert_load": load[:e.num],
            "zero_expert_load": load[e.num:] if e.zero else None,
            "experts_hit": hit,
            "max_load": max(load[:e.held]),
            "weights": f"random for the {hit} experts hit, zeros (never read) for the other {e.held - hit}",
            **({"local_experts": e.held,
                "local_pairs": sum(load[:e.held])} if e.held < e.num else {}),
        }
