"""One MoE layer of a checkpoint as `moe` case args (docs/case-format.md, "moe").

Under TP without expert parallelism vLLM's FusedMoE keeps every expert on every rank and
splits each expert's intermediate size, so `experts.inter` and `shared.inter` are per rank
and `hidden` stays whole. The router reads the config: sigmoid/softmax/sqrtsoftplus scoring,
grouped top-k when `n_group` > 1, a score-correction bias for `noaux_tc`, the routed scale.
"""

from __future__ import annotations

from typing import Any

from operatorx.catalog.arch import Arch
from operatorx.catalog.errors import MissingField
from operatorx.catalog.gemm_roles import split
from operatorx.catalog.schemes import Scheme

__all__ = ["moe_args", "ROUTING_DISTRIBUTIONS"]

#: The distributions the format names; zipf with s=1.2 as the skewed case.
ROUTING_DISTRIBUTIONS: tuple[Any, ...] = ("natural", "balanced", "single_hot", {"kind": "zipf", "s": 1.2})


def _router(arch: Arch, hash_routed: bool = False) -> dict[str, Any]:
    """The router of a MoE layer. `hash_routed`: a DeepSeek-V4 hash layer, which picks experts
    from a token-id table (`tid2eid`) and has no score-correction bias (vLLM DeepseekV4MoE)."""
    what = "the MoE router"
    arch.int("num_experts", what)
    scoring = arch.get("scoring_func", what)
    groups = arch.opt("n_group") or 1
    select: dict[str, Any] = {"kind": "topk"}
    if hash_routed:
        select = {"kind": "hash", "vocab": arch.int("vocab_size", "hash-routed MoE layers (tid2eid rows)")}
    elif groups > 1:
        select = {"kind": "grouped_topk", "groups": groups, "topk_groups": arch.int("topk_group", what)}
    gate: dict[str, Any] = {"dtype": arch.opt("gate_dtype", "bf16")}
    if arch.opt("gate_logits") is not None:
        gate["logits"] = arch.opt("gate_logits")
    router: dict[str, Any] = {"gate": gate, "scoring": scoring, "select": select}
    bias = arch.opt("e_score_correction_bias")
    if bias is None and arch.opt("topk_method") == "noaux_tc":
        bias = True
    if hash_routed:
        bias = None
    if bias is not None:
        router["bias"] = bool(bias)
    if arch.has("norm_topk_prob"):
        router["renormalize"] = bool(arch.get("norm_topk_prob", what))
    scale = arch.opt("routed_scaling_factor")
    if scale is not None and float(scale) != 1.0:
        router["scale"] = float(scale)
    return router


def _activation(arch: Arch) -> dict[str, Any]:
    act = arch.opt("activation")
    if act is not None:
        return dict(act)
    hidden_act = arch.get("hidden_act", "the expert activation")
    if hidden_act != "silu":
        raise MissingField("activation", f"experts with hidden_act={hidden_act!r} ({arch.origin})")
    out: dict[str, Any] = {"kind": "silu", "gated": True}
    if arch.opt("swiglu_limit") is not None:
        out["limit"] = float(arch.get("swiglu_limit", ""))
    return out


def moe_args(arch: Arch, experts: Scheme, shared: Scheme, tp: int, tokens: int,
             distribution: Any = "natural", seed: int = 0, hash_routed: bool = False) -> dict[str, Any]:
    """The `moe` args of one layer at `tp` for `tokens` tokens; MissingField names a gap."""
    what = "the MoE layer"
    inter = arch.moe_inter(what)
    args: dict[str, Any] = {
        "tokens": tokens,
        "hidden": arch.int("hidden_size", what),
        "experts": {
            "num": arch.int("num_experts", what),
            "top_k": arch.int("top_k", what),
            "inter": split(inter, tp, "moe_intermediate_size", arch.origin),
            "a1": experts.a, "w1": experts.b, "w2": experts.b, "a2": experts.a,
        },
        "router": _router(arch, hash_routed),
        "activation": _activation(arch),
        "shared": None,
        "routing": {"distribution": distribution, "seed": seed},
        "parallel": {"tp": tp},
    }
    if arch.config.get("model_type") == "gpt_oss":
        args["experts"]["bias"] = True
    if arch.opt("shared_expert_intermediate_size"):
        s_inter = arch.int("shared_expert_intermediate_size", "shared expert")
        args["shared"] = {"count": 1, "inter": split(s_inter, tp, "shared_expert_intermediate_size", arch.origin),
                          "a1": shared.a, "w1": shared.b, "w2": shared.b, "gate": "sigmoid"}
    elif arch.opt("n_shared_experts"):
        count = arch.int("n_shared_experts", "shared experts")
        args["shared"] = {"count": 1, "inter": split(inter * count, tp, "moe_intermediate_size*n_shared_experts",
                                                     arch.origin),
                          "a1": shared.a, "w1": shared.b, "w2": shared.b}
    return args
