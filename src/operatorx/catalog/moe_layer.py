"""One MoE layer of a checkpoint as `moe` case args (docs/case-format.md, "moe").

Under TP without expert parallelism vLLM's FusedMoE keeps every expert on every rank and
splits each expert's intermediate size, so `experts.inter` and `shared.inter` are per rank
and `hidden` stays whole. The router reads the config: sigmoid/softmax/sqrtsoftplus scoring,
grouped top-k when `n_group` > 1 or when the model's vLLM block builds the grouped router
(implementation `grouped_topk`: DeepseekV2MoE, Glm4MoE, even at one group), a score-correction
bias for `noaux_tc`, the routed scale.

Every field that changes what the layer computes is written, never left to a reader's
default: the gate's weight and logits dtypes, `bias`, `renormalize`, `scale`,
`weight_on_input`, the activation's `gated`/`interleaved` (and its limit when it has one),
the experts' `bias`. A fact neither config.json nor the implementation table states is a
MissingField, not a guess.

Latent MoE (Kimi-K3, `routed_expert_hidden_size`): the case carries `experts.latent` and
`experts.latent_norm`; the shared experts still run at `hidden`.

MXFP4 experts (gpt-oss): vLLM 0.26 rounds the per-rank intermediate size up to its MXFP4
backend's alignment when it builds the layer (`mxfp4_round_up_hidden_size_and_intermediate_size`
in fused_moe/oracle/mxfp4.py: 64 for the OAI-Triton backend an H200 without FlashInfer
runs), so 2880/4 = 720 runs as 768 and 2880/8 = 360 as 384, the padding rows zero. The case
carries the padded size; `moe_args` reports the unpadded one so the caller can note it.
"""

from __future__ import annotations

from typing import Any

from operatorx.catalog.arch import Arch
from operatorx.catalog.errors import MissingField
from operatorx.catalog.gemm_roles import split
from operatorx.catalog.schemes import Scheme

__all__ = ["moe_args", "experts_inter", "gate_dtype_of", "ROUTING_DISTRIBUTIONS"]

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
    elif groups > 1 or arch.opt("grouped_topk"):  # vLLM's grouped router, even over one group
        select = {"kind": "grouped_topk", "groups": groups, "topk_groups": arch.int("topk_group", what)}
    gate_dtype = gate_dtype_of(arch)
    gate: dict[str, Any] = {"dtype": gate_dtype, "logits": arch.opt("gate_logits") or gate_dtype}
    router: dict[str, Any] = {"gate": gate, "scoring": scoring, "select": select}
    bias = arch.opt("e_score_correction_bias")
    if bias is None:
        bias = arch.opt("topk_method") == "noaux_tc"
    router["bias"] = bool(bias) and not hash_routed
    router["renormalize"] = bool(arch.get("norm_topk_prob", f"{what}'s top-k renormalization"))
    router["scale"] = float(arch.opt("routed_scaling_factor", 1.0) or 1.0)
    router["weight_on_input"] = False
    return router


def gate_dtype_of(arch: Arch) -> str:
    """The router gate's weight/compute dtype: the implementation's `gate_dtype`, else bf16
    (vLLM's GateLinear/ReplicatedLinear in the model dtype, built with quant_config=None)."""
    return str(arch.opt("gate_dtype", "bf16"))


def _activation(arch: Arch) -> dict[str, Any]:
    act = arch.opt("activation")
    if act is not None:
        out = dict(act)
        out.setdefault("gated", True)
        out.setdefault("interleaved", False)
        return out
    hidden_act = arch.get("hidden_act", "the expert activation")
    if hidden_act != "silu":
        raise MissingField("activation", f"experts with hidden_act={hidden_act!r} ({arch.origin})")
    out = {"kind": "silu", "gated": True, "interleaved": False}
    if arch.opt("swiglu_limit") is not None:
        out["limit"] = float(arch.get("swiglu_limit", ""))
    return out


def _latent(arch: Arch) -> dict[str, Any]:
    """Latent MoE (Kimi-K3): the routed experts run at `routed_expert_hidden_size`, projected down
    from `hidden` before them and up after, with an RMS norm on the latent input when
    `latent_moe_use_norm` says so. Empty for every other model (the experts run at `hidden`)."""
    if arch.opt("routed_expert_hidden_size") is None:
        return {}
    width = arch.int("routed_expert_hidden_size", "the latent MoE width")
    return {"latent": width, "latent_norm": bool(arch.get("latent_moe_use_norm", "the latent MoE input norm"))}


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def experts_inter(arch: Arch, experts: Scheme, tp: int) -> tuple[int, int]:
    """(the per-rank expert intermediate size the layer runs, the unpadded per-rank size)."""
    per_rank = split(arch.moe_inter("the MoE layer"), tp, "moe_intermediate_size", arch.origin)
    align = arch.opt("mxfp4_inter_align")
    is_mxfp4 = experts.b.get("dtype") == "e2m1" and (experts.b.get("scale") or {}).get("dtype") == "ue8m0"
    if align and is_mxfp4:
        return round_up(per_rank, int(align)), per_rank
    return per_rank, per_rank


def moe_args(arch: Arch, experts: Scheme, shared: Scheme, tp: int, tokens: int,
             distribution: Any = "natural", seed: int = 0, hash_routed: bool = False) -> dict[str, Any]:
    """The `moe` args of the layer one rank runs at `tp` (tp=1: the whole layer) for `tokens` tokens;
    MissingField names a gap. No `parallel`: the caller adds the split for a whole-layer case."""
    what = "the MoE layer"
    inter = arch.moe_inter(what)
    run_inter, _ = experts_inter(arch, experts, tp)
    args: dict[str, Any] = {
        "tokens": tokens,
        "hidden": arch.int("hidden_size", what),
        "experts": {
            "num": arch.int("num_experts", what),
            "top_k": arch.int("top_k", what),
            "inter": run_inter,
            "a1": experts.a, "w1": experts.b, "w2": experts.b, "a2": experts.a,
            "bias": arch.config.get("model_type") == "gpt_oss",
            **_latent(arch),
        },
        "router": _router(arch, hash_routed),
        "activation": _activation(arch),
        "shared": None,
        "routing": {"distribution": distribution, "seed": seed},
    }
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
