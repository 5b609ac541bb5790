"""The vllm MoE backend: vLLM's router gate + FusedMoE (+ shared-expert MLP) as one model block.

prepare (untimed): build the block under the implied quant config (quant_map), load synthetic
weights for every expert in the checkpoint's format, process_weights_after_loading, run once
(recording the routing), capture a CUDA graph when vLLM would replay one. fn (timed): the block
forward, gate GEMM to combined output, inside vLLM's forward context (entered once per case, as an
engine enters it once per step for all layers).
"""

from __future__ import annotations

import gc
from contextlib import ExitStack
from typing import Any, Optional

from operatorx.backends.base import Check, Prepared
from operatorx.backends.ranked import RankComm, RankPrepared
from operatorx.backends.torch.memory import require_memory
from operatorx.backends.vllm import quant_map
from operatorx.backends.vllm.common import VllmBackendBase
from operatorx.backends.vllm.env import VllmEnv
from operatorx.spec import Case
from operatorx.spec.moe import MoeArgs

__all__ = ["VllmMoe", "CHECK_ROWS", "BOUND"]

CHECK_ROWS = 64
#: bf16: output and intermediate rounding; fp8: plus activation roundings that flip between the
#: reference's emulation and vLLM's kernels after the bf16 intermediate.
BOUND = {"bf16": 1.5e-2, "fp8": 3e-2}
ROUTER_BOUND = 2e-2


def _device_bytes(args: MoeArgs) -> int:
    """Layer weights, the reference's copies, one expert's fp32 dequant, activations, slack."""
    e, h, t = args.experts, args.hidden, args.tokens
    per_expert = 3 * e.inter * h
    wbytes = 1 if e.w1.dtype == "e4m3" else 2
    total = 2 * e.num * per_expert * wbytes + per_expert * (2 + 4)
    total += e.num * h * 2 + t * h * 2 * 4 + t * e.top_k * (2 * e.inter + h) * 2 * 2
    if args.shared is not None:
        total += 3 * args.shared.inter * args.shared.count * h * (wbytes * 2 + 4)
    return total + (1 << 29)


class VllmMoe(VllmBackendBase):
    op_type = "moe"
    plan_of = staticmethod(quant_map.moe_plan)

    def prepare(self, case: Case, device: str) -> Prepared:
        args = case.args
        assert isinstance(args, MoeArgs)
        plan = self.plan_or_refuse(case)
        require_memory(_device_bytes(args), "cuda")
        from operatorx.backends.vllm.moe_prepare import build_moe

        def build(stack: ExitStack) -> Any:
            # first in, so last out: the workspace vLLM's modular MoE kernels grew goes back after the
            # block, on release or a failed build, once no other live case (a placement copy) replays it
            stack.callback(VllmEnv.get().hold_workspace())
            return build_moe(case, args, plan, stack)

        built, stack = self.build_in_stack(build)
        return _prepared(args, plan, built, stack)

    def supports_ranks(self, case: Case, device: str, world: int) -> Optional[str]:
        """The single-device refusals, then the split's (backends/vllm/ranks.py)."""
        from operatorx.backends.vllm.ranks import moe_rank_refusal

        why = self.supports(case, device)
        if why is not None:
            return why
        assert isinstance(case.args, MoeArgs)
        plan = self.plan_of(case.args)
        return moe_rank_refusal(case, None if isinstance(plan, str) else plan.scheme, world)

    def prepare_ranks(self, case: Case, device: str, comm: RankComm) -> RankPrepared:
        """This rank's FusedMoE block under tp or ep over the tp ranks (vLLM shards it)."""
        from operatorx.backends.vllm.ranks import moe_collectives, rank_setup, ranked

        setup = rank_setup(case, comm)
        VllmEnv.for_ranks(setup)
        prepared = self.prepare(case, device)
        return ranked(prepared, case, comm, moe_collectives(comm.world))


def _prepared(args: MoeArgs, plan: quant_map.Plan, built: Any, stack: ExitStack) -> Prepared:
    import torch

    from operatorx.backends.vllm.moe_reference import moe_reference
    from operatorx.backends.vllm.reference import best_flavor, rel_error, route_weights

    state: dict[str, Any] = {"built": built}

    def fn() -> Any:
        return state["built"].timed()

    def check() -> Check:
        b = state["built"]
        seen = b.run_recorded()                     # eager, recording the routing it takes
        out = fn()                                  # what is timed (graph replay when captured)
        rows = min(args.tokens, CHECK_ROWS)
        skipped = None
        if b.monolithic:            # the kernel routed inside: compare where the router's choice is unambiguous
            picked, skipped = untied_check_rows(_untied_rows(b, args.experts.top_k), CHECK_ROWS)
            if picked.numel() == 0:
                return Check.not_checked(f"every one of the {args.tokens} token(s) has a top-{args.experts.top_k} "
                                         "that ends in a tie, so the monolithic kernel's routing is not known here")
            seen = {k: v[picked] for k, v in seen.items()}
            x, out, rows = b.x[picked], out[picked], int(picked.numel())
        else:
            x = b.x[:rows]
        r = args.router
        on_output = bool(b.metadata["wiring"].get("routed_scale_on_output"))
        logits = x.float() @ b.ref["gate"].float().T
        # routed scale on the output (Glm4MoE): the router's top-k weights are unscaled
        router_w = route_weights(logits, seen["router_ids"][:rows], r.scoring, bool(r.renormalize),
                                 None if on_output else r.scale)
        router_err = rel_error(seen["weights"][:rows], router_w)
        hash_note = ""
        if b.ref.get("hash_table") is not None:     # the router's ids must be the table's rows for the tokens
            want = b.ref["hash_table"][b.block.input_ids[:rows].long()].long().sort(dim=-1).values
            got = seen["router_ids"][:rows].long().sort(dim=-1).values
            same = bool(torch.equal(want, got))
            b.metadata["hash_ids_match_table"] = same
            hash_note = "; router ids equal the hash table's rows" if same else \
                "; router ids DIFFER from the hash table's rows for the tokens"
            if not same:
                router_err = float("inf")
        routed_scale = float(r.scale) if on_output and r.scale is not None else 1.0
        refs = moe_reference(x, seen["ids"], seen["weights"], b.ref, plan.scheme, args.activation, routed_scale)
        err, flavor = best_flavor(out[:rows].float(), plan.scheme, lambda f: refs[f], tuple(refs))
        b.metadata["activation_scales_used"] = flavor
        b.metadata["router_weights_rel_error"] = router_err
        bound = BOUND["bf16" if plan.scheme == "bf16" else "fp8"]
        worst = max(err, router_err * bound / ROUTER_BOUND) if router_err == router_err else router_err
        text = (f"fp32 MoE block of the dequantized checkpoint weights on the routing vLLM used "
                f"(output rel error {err:.3g}, {flavor} activation scales; router weights vs fp32 scores "
                f"{router_err:.3g}, bound {ROUTER_BOUND:g}, scaled into the reported error){hash_note}")
        act = b.metadata["wiring"].get("activation") or {}
        if act.get("activation", "silu") != "silu" or "swiglu_limit" in act:
            text += "; activation " + ", ".join(f"{k}={v}" for k, v in act.items()) + " computed in the reference"
        if b.graph is not None:
            text += "; output of the CUDA-graph replay"
        if skipped is not None:
            text += (f"; monolithic experts kernel (routes inside): routing from vLLM's router on the same logits, "
                     f"{skipped} row(s) whose top-{args.experts.top_k} ends in a tie left out")
        return Check(worst, bound, rows, text)

    layers = _layers(built)

    def release() -> None:
        try:
            _let_go(state.pop("built", None), layers)
        finally:
            stack.close()                           # the workspace last (prepare's hold_workspace)
            # vLLM's modules sit in reference cycles (hooks and bound methods back to their owner), so
            # dropping the last outside reference frees nothing until a later GC pass: each released
            # case would hold its weights until some later case's allocation triggered one.
            # The collection runs here, after `_let_go` returned: a local still naming the block
            # while it runs would keep the whole block alive through it.
            gc.collect()

    return Prepared(fn=fn, check=check, metadata=built.metadata, release=release,
                    min_bytes=args.min_bytes(experts_hit=built.metadata["experts_hit"]), layers=layers)


def _untied_rows(built: Any, top_k: int) -> Any:
    """Per token: its k-th and (k+1)-th largest logits differ, so a monolithic kernel and vLLM's router
    must agree on its experts (on an exact tie each may keep either)."""
    import torch

    with torch.no_grad():
        logits = built.logits().float()
    if logits.shape[-1] <= top_k:
        return torch.ones(logits.shape[0], dtype=torch.bool, device=logits.device)
    top = logits.topk(top_k + 1, dim=-1).values
    return top[:, top_k - 1] != top[:, top_k]


def untied_check_rows(untied: Any, limit: int) -> tuple[Any, int]:
    """The first `limit` untied tokens (searched over all of them, so a tie among the first rows does
    not shrink the check), and how many tied tokens were passed over before the last one taken."""
    picked = untied.nonzero().flatten()[:limit]
    skipped = 0 if picked.numel() == 0 else int(picked[-1]) + 1 - int(picked.numel())
    return picked, skipped


def _let_go(built: Any, layers: dict[str, Any]) -> None:
    """Drop every reference this backend made into the block: the deeper entry points (bound methods
    of the block), the router hook set on the router instance, the config's layer registry, the graph."""
    layers.clear()
    if built is not None:
        built.forget()


def _layers(built: Any) -> dict[str, Any]:
    """Deeper entry points for `--host`, each the whole block on the same input: the eager block
    forward (when the timed call is a graph replay: the engine's eager step), and the block as its
    public pieces called one by one (gate → router.select_experts → RoutedExperts.forward_modular
    → shared MLP → combine), which skips the runner's `moe_forward` custom op. Monolithic kernels
    have no select/apply split: only the eager forward is offered for them."""
    out: dict[str, Any] = {}
    if built.graph is not None:
        out["block.forward"] = built.eager
    if not built.monolithic:     # a monolithic kernel has no select/apply split
        out["gate+select_experts+forward_modular+shared"] = built.decomposed
    return out
