"""Prepare one vLLM MoE block: build, load, process, run once, maybe capture (imports vLLM)."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Optional, cast

import torch
from torch import nn

from operatorx.backends.base import Unsupported
from operatorx.backends.vllm.common import built_metadata, class_name, kernel_of_linear, vllm_refusals
from operatorx.backends.vllm.env import VllmEnv, build_quant_config
from operatorx.backends.vllm.graphs import CapturedCall, GraphOrEager, capture_for, eager_kernel_names, graph_size
from operatorx.backends.vllm.moe_build import MoeBlock, RouterHook, build_block, load_block, process_after_loading
from operatorx.backends.vllm.quant_map import Plan
from operatorx.backends.vllm.weights import param_summary
from operatorx.spec import Case
from operatorx.spec.moe import HashSelect, MoeArgs

__all__ = ["BuiltMoe", "build_moe"]

_BACKEND_ATTRS = ("fp8_backend", "unquantized_backend", "mxfp4_backend", "nvfp4_backend", "mxfp8_backend",
                  "int8_backend", "wna16_moe_backend")


@dataclass
class BuiltMoe(GraphOrEager):
    block: MoeBlock
    hook: RouterHook
    x: torch.Tensor
    ref: dict[str, Any]
    env: VllmEnv
    prefix: str
    graph: Optional[CapturedCall] = None
    metadata: dict[str, Any] = field(default_factory=dict)
    monolithic: bool = False
    """The experts' kernel routes inside (gpt-oss's triton_kernels MoE): vLLM's router never runs in the
    forward, so the routing the check needs is asked of that router on the same logits."""

    def eager(self) -> torch.Tensor:
        return self.block(self.x)

    def select(self) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM's router on the block's own logits (through the hook, so forced ids apply)."""
        runner: Any = self.block.experts
        re: Any = runner.routed_experts
        weights, ids = runner.router.select_experts(hidden_states=self.x, router_logits=self.logits(),
                                                    topk_indices_dtype=re.quant_method.topk_indices_dtype,
                                                    input_ids=self.block.input_ids)
        return weights, ids

    def run_recorded(self) -> dict[str, torch.Tensor]:
        self.hook.record, self.hook.seen = True, None
        try:
            self.eager()
            if self.monolithic:
                self.select()
            torch.cuda.synchronize()
        finally:
            self.hook.record = False
        if self.hook.seen is None:
            raise RuntimeError("the router's select_experts was not called: a monolithic MoE kernel routes "
                               "inside, so the routing cannot be read (or forced) from outside")
        return self.hook.seen

    def logits(self) -> torch.Tensor:
        """The router gate as the model block calls it (GateLinear/ReplicatedLinear return a pair)."""
        gate, w = self.block.gate, self.block.wiring
        if w is not None and w.style == "glm4_moe":
            return cast(torch.Tensor, gate(self.x.to(dtype=torch.float32)))
        return cast(torch.Tensor, gate(self.x)[0])

    def decomposed(self) -> torch.Tensor:
        """The block as its public pieces, called one by one without the runner's custom op: gate,
        `router.select_experts`, `RoutedExperts.forward_modular` (quant_method.apply), the shared
        MLP, then the runner's combine (routed scale on the output where the block asks, + shared).
        Host time split: what the `moe_forward` custom op and the forward context cost on top."""
        runner: Any = self.block.experts
        re: Any = runner.routed_experts
        x = self.x
        weights, ids = self.select()
        out = re.forward_modular(x=x, topk_weights=weights, topk_ids=ids)
        w = self.block.wiring
        if w is not None and w.routed_scale_on_output and runner.routed_scaling_factor != 1.0:
            out = out * runner.routed_scaling_factor
        if self.block.shared is not None:
            out = out + self.block.shared(x)
        return cast(torch.Tensor, out)

    def forget(self) -> None:
        """Break what ties the block to itself and to the process: the router's instance attribute
        `select_experts` (our hook, holding the router's bound method: a cycle through the router),
        the hook's recorded tensors, the graph, and the config's layer registry."""
        self.graph = None
        router = getattr(getattr(self.block, "experts", None), "router", None)
        if router is not None and router.__dict__.get("select_experts") is self.hook:
            del router.select_experts
        self.hook.inner, self.hook.forced, self.hook.seen = None, None, None
        self.hook._forced_as.clear()
        self.env.forget_layer(f"{self.prefix}.experts")


def build_moe(case: Case, args: MoeArgs, plan: Plan, stack: ExitStack) -> BuiltMoe:
    env = VllmEnv.get()
    stack.enter_context(env.case_scope(forward_context=True))
    with vllm_refusals(f"the quant config {plan.quant.cls if plan.quant else None}", construction=True):
        quant_config = build_quant_config(plan.quant)
    prefix = env.unique_prefix("mlp")
    with torch.device("cuda"):
        block, wiring = build_block(args, quant_config, prefix, shared_unquantized=plan.shared_scheme == "bf16")
    built = BuiltMoe(block, RouterHook(None, None), torch.empty(0), {}, env, prefix)
    stack.callback(built.forget)
    runner = block.experts
    re = cast(nn.Module, runner.routed_experts)     # FusedMoE's RoutedExperts (vLLM is untyped here)
    qm = re.quant_method
    if plan.quantized and class_name(qm) == "UnquantizedFusedMoEMethod":
        raise Unsupported(f"vLLM built the experts unquantized under {plan.quant.cls if plan.quant else '-'}; "
                          "timing bf16 experts in their place would be another op")

    gen = torch.Generator(device="cuda").manual_seed(case.seed())
    before = {"routed_experts": param_summary(re)}
    built.ref = load_block(block, args, plan.scheme, gen, plan.weight_scale_dtype, plan.shared_scheme,
                           rank=env.ranks.rank if env.ranks is not None else None)
    with vllm_refusals("process_weights_after_loading", construction=True):
        process_after_loading(block)
    after = {"routed_experts": param_summary(re)}
    qm = re.quant_method
    _refuse_unclamped_fusion(args, plan, qm)
    built.monolithic = bool(getattr(qm, "is_monolithic", False))
    if built.monolithic and args.routing.distribution != "natural":
        raise Unsupported(f"forced routing ({args.routing.name}) with {class_name(qm)}, monolithic here: its kernel "
                          "routes inside, so the router's ids cannot be replaced")

    forced = None
    if args.routing.distribution != "natural":
        from operatorx.backends.torch.moe.routing import forced_ids

        forced = forced_ids(args.routing, args.tokens, args.experts.num, args.experts.top_k)
    router: Any = runner.router     # vLLM's router: its select_experts is replaced on the instance below
    built.hook = RouterHook(router.select_experts, forced.cuda() if forced is not None else None)
    router.select_experts = built.hook          # instance attribute shadows the method

    built.x = torch.randn(args.tokens, args.hidden, generator=gen, device="cuda", dtype=torch.bfloat16)
    if isinstance(args.router.select, HashSelect):   # token ids the hash layer routes by
        block.input_ids = torch.randint(0, args.router.select.vocab, (args.tokens,), generator=gen, device="cuda")
    with vllm_refusals("the MoE forward", construction=False):
        seen = built.run_recorded()
    size = graph_size(args.tokens, env.capture_sizes)
    if size is not None:
        with vllm_refusals("CUDA-graph capture of the MoE block", construction=False):
            built.graph = capture_for(built.eager, env.ranks.world if env.ranks is not None else 1)
    built.metadata = _metadata(args, plan, block, wiring, before, after, seen, forced is not None, size, env)
    if built.graph is not None:
        built.metadata["eager_kernels"] = eager_kernel_names(built.eager)
    return built


def _refuse_unclamped_fusion(args: MoeArgs, plan: Plan, qm: Any) -> None:
    """vLLM 0.26 TritonExperts.apply fuses SiLU-and-mul with the fp8 1x128 quant of the second GEMM's
    input (`ops.silu_and_mul_per_block_quant`) for fp8 [128, 128] blocks when DeepGEMM's E8M0 is not
    used, and that fused kernel has no clamp: a clamped SiLU would silently run unclamped."""
    act = args.activation
    if plan.scheme != "fp8_block" or act.kind != "silu" or act.limit is None:
        return
    from vllm.model_executor.layers.quantization.utils.fp8_utils import is_deep_gemm_e8m0_used

    facts = _kernel_facts(qm)
    experts = f"{facts.get('experts_cls')} {facts.get('fused_experts')}"
    if "Triton" in experts and not is_deep_gemm_e8m0_used():
        raise Unsupported("clamped SiLU (limit) with fp8 block experts: with DeepGEMM E8M0 off, vLLM 0.26's "
                          "TritonExperts fuses SiLU-and-mul with the 1x128 quant (silu_and_mul_per_block_quant), "
                          "which has no clamp; vLLM would compute an unclamped SiLU")


def _kernel_facts(qm: Any) -> dict[str, Any]:
    facts: dict[str, Any] = {"quant_method": class_name(qm), "experts_cls": getattr(getattr(qm, "experts_cls", None),
                                                                                   "__name__", None)}
    for attr in _BACKEND_ATTRS:
        value = getattr(qm, attr, None)
        if value is not None:
            facts[attr] = str(value)
    mk = getattr(qm, "moe_kernel", None)
    if mk is not None:
        facts["fused_experts"] = class_name(getattr(mk, "fused_experts", None))
        facts["prepare_finalize"] = class_name(getattr(mk, "prepare_finalize", None))
    facts["is_monolithic"] = bool(getattr(qm, "is_monolithic", False))
    return facts


def _metadata(args: MoeArgs, plan: Plan, block: MoeBlock, wiring: dict[str, Any], before: dict[str, Any],
              after: dict[str, Any], seen: dict[str, torch.Tensor], forced: bool, size: Optional[int],
              env: VllmEnv) -> dict[str, Any]:
    from operatorx.backends.torch.moe.routing import load_histogram

    e = args.experts
    load = load_histogram(seen["ids"], e.num)
    hit = sum(1 for c in load if c)
    runner = block.experts
    meta: dict[str, Any] = {
        **built_metadata("vllm.model_executor.layers.fused_moe.FusedMoE → " + (class_name(runner) or "?"),
                         plan, before, after, size, env),
        "wiring": wiring,
        "router": class_name(runner.router),
        "experts": _kernel_facts(cast(nn.Module, runner.routed_experts).quant_method),
        "routing": {"distribution": args.routing.name, "seed": args.routing.seed, "forced": forced,
                    "how": "router ran; its top-k ids replaced by the forced ones (its weights kept)" if forced
                    else "vLLM's router's own choice"},
        "expert_load": load,
        "experts_hit": hit,
        "max_load": max(load) if load else 0,
        "synthetic_weights": "random for every expert, in the checkpoint format",
    }
    if block.shared is not None:
        meta["shared"] = {"gate_up_proj": kernel_of_linear(block.shared.gate_up_proj),
                          "down_proj": kernel_of_linear(block.shared.down_proj)}
    if size is not None and size != args.tokens:
        meta["graph_note"] = f"vLLM would pad {args.tokens} tokens to its captured size {size}; timed at {args.tokens}"
    if plan.notes:
        meta["notes"] = list(plan.notes)
    if env.ranks is not None:
        meta["rank_layer"] = _rank_facts(runner, env)
    return meta


def _rank_facts(runner: Any, env: VllmEnv) -> dict[str, Any]:
    """How vLLM split the layer over the ranks: its own MoE parallel config, as it chose it."""
    pc = getattr(getattr(runner, "moe_config", None), "moe_parallel_config", None)
    facts: dict[str, Any] = {"rank": env.ranks.rank if env.ranks else None,
                             "world": env.ranks.world if env.ranks else None,
                             "tp_all_reduce": env.tp_all_reduce()}
    for name in ("tp_size", "ep_size", "dp_size", "ep_rank", "use_ep", "all2all_backend"):
        facts[name] = getattr(pc, name, None)
    facts["all2all_kernels_used"] = getattr(pc, "use_all2all_kernels", None)
    re = getattr(runner, "routed_experts", None)
    facts["local_experts"] = getattr(re, "local_num_experts", None)
    return facts
