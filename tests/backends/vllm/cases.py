"""Case builders shared by the vllm backend tests."""

from __future__ import annotations

from typing import Any, Optional

from operatorx.spec import Case

BF16 = {"dtype": "bf16"}


def scale(dtype: str, static: bool, group: list[int]) -> dict[str, Any]:
    return {"dtype": dtype, "static": static, "group": group}


def fp8(dtype: str, static: bool, group: list[int]) -> dict[str, Any]:
    return {"dtype": "e4m3", "scale": scale(dtype, static, group)}


SCHEMES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "bf16": (BF16, BF16),
    "fp8_block": (fp8("fp32", False, [1, 128]), fp8("fp32", True, [128, 128])),
    "fp8_block_ue8m0": (fp8("ue8m0", False, [1, 128]), fp8("ue8m0", True, [128, 128])),
    # Qwen3.5 / Qwen3-Next FP8: weight_scale_inv stored in bf16
    "fp8_block_bf16scale": (fp8("fp32", False, [1, 128]), fp8("bf16", True, [128, 128])),
    "fp8_tensor_static": (fp8("fp32", True, [-1, -1]), fp8("fp32", True, [-1, -1])),
    "fp8_tensor_dynamic": (fp8("fp32", False, [-1, -1]), fp8("fp32", True, [-1, -1])),
    "fp8_token_channel": (fp8("fp32", False, [1, -1]), fp8("fp32", True, [-1, 1])),
    "fp8_token_tensor": (fp8("fp32", False, [1, -1]), fp8("fp32", True, [-1, -1])),
    "mxfp8": (fp8("ue8m0", False, [1, 32]), fp8("ue8m0", True, [1, 32])),
    "mxfp4_w4a16": (BF16, {"dtype": "e2m1", "scale": scale("ue8m0", True, [1, 32])}),
    "int4_w4a16": (BF16, {"dtype": "int4", "scale": scale("bf16", True, [1, 32])}),
    "nvfp4": ({"dtype": "e2m1", "scale": scale("e4m3", False, [1, 16]), "scale2": scale("fp32", True, [-1, -1])},
              {"dtype": "e2m1", "scale": scale("e4m3", True, [1, 16]), "scale2": scale("fp32", True, [-1, -1])}),
}


def gemm_case(scheme: str, m: int = 16, n: int = 512, k: int = 512, **extra: Any) -> Case:
    a, b = SCHEMES[scheme]
    return Case.model_validate({"type": "gemm", "args": {"m": m, "n": n, "k": k, "a": a, "b": b, **extra}})


def moe_case(scheme: str, style: str = "deepseek", tokens: int = 8, routing: Optional[dict[str, Any]] = None,
             num: int = 16, top_k: int = 4, hidden: int = 512, inter: int = 256,
             activation: Optional[dict[str, Any]] = None, shared: bool = True, shared_bf16: bool = False,
             shared_as: Optional[str] = None, expert_bias: bool = False) -> Case:
    """style: deepseek (bf16 GateLinear, sigmoid grouped), qwen (softmax, gated shared expert),
    glm (fp32 gate, sigmoid grouped_topk 1/1 as GLM-4.5), minimax (fp32 gate, sigmoid top-k, no shared),
    dsv4 / dsv4_hash (bf16 gate, fp32 logits, sqrtsoftplus; top-k with bias / hash table over 1000 ids),
    gpt_oss (bf16 gate, softmax top-k renormalized, no shared expert)."""
    a, w = SCHEMES[scheme]
    experts = {"num": num, "top_k": top_k, "inter": inter, "a1": a, "w1": w, "w2": w, "a2": a, "bias": expert_bias}
    args: dict[str, Any] = {"tokens": tokens, "hidden": hidden, "experts": experts,
                            "activation": activation or {"kind": "silu", "gated": True},
                            "routing": routing or {"distribution": "natural", "seed": 0}}
    # shared_bf16: a checkpoint that leaves it unquantized; shared_as: another scheme (DeepSeek-V4: block FP8)
    sa, sw = SCHEMES["bf16" if shared_bf16 else shared_as] if (shared_bf16 or shared_as) else (a, w)
    plain_shared = {"count": 1, "inter": inter, "a1": sa, "w1": sw, "w2": sw}
    if style == "deepseek":
        args["router"] = {"gate": {"dtype": "bf16"}, "scoring": "sigmoid", "bias": True, "renormalize": True,
                          "scale": 2.5, "select": {"kind": "grouped_topk", "groups": 4, "topk_groups": 2}}
        args["shared"] = plain_shared
    elif style == "glm":
        args["router"] = {"gate": {"dtype": "fp32", "logits": "fp32"}, "scoring": "sigmoid", "bias": True,
                          "renormalize": True, "scale": 2.5, "select": {"kind": "grouped_topk", "groups": 1,
                                                                       "topk_groups": 1}}
        args["shared"] = plain_shared
    elif style in ("dsv4", "dsv4_hash"):
        select = {"kind": "hash", "vocab": 1000} if style == "dsv4_hash" else {"kind": "topk"}
        args["router"] = {"gate": {"dtype": "bf16", "logits": "fp32"}, "scoring": "sqrtsoftplus",
                          "bias": style == "dsv4", "renormalize": True, "scale": 1.5, "select": select}
        args["shared"] = plain_shared
    elif style == "gpt_oss":
        args["router"] = {"gate": {"dtype": "bf16"}, "scoring": "softmax", "select": {"kind": "topk"},
                          "renormalize": True}
    elif style == "minimax":
        args["router"] = {"gate": {"dtype": "fp32", "logits": "fp32"}, "scoring": "sigmoid", "bias": True,
                          "renormalize": True, "scale": 1.0, "select": {"kind": "topk"}}
    else:
        args["router"] = {"gate": {"dtype": "bf16"}, "scoring": "softmax", "select": {"kind": "topk"},
                          "renormalize": False}
        args["shared"] = {**plain_shared, "gate": "sigmoid"}
    if not shared:
        args.pop("shared", None)
    return Case.model_validate({"type": "moe", "args": args})


def check_or_reason(backend: Any, case: Case) -> tuple[Any, Any]:
    """(Prepared, its Check) after one timed call; (None, the reason) when the backend refuses the case."""
    reason = backend.supports(case, "cuda")
    if reason is not None:
        return None, reason
    prepared = backend.prepare(case, "cuda")
    try:
        check = prepared.check()
        prepared.fn()
        return prepared, check
    finally:
        if prepared.release is not None:
            prepared.release()


def prepare_and_check(backend: Any, case: Case) -> tuple[Any, Any]:
    """check_or_reason for a case the backend must take (its refusal is the failure message)."""
    prepared, check = check_or_reason(backend, case)
    assert prepared is not None, check
    return prepared, check


class WorkspaceRecorder:
    """A stand-in for a built module and for VllmEnv (its own workspace count): what happened, in order."""

    def __init__(self) -> None:
        from operatorx.backends.vllm.env import VllmEnv

        self.events: list[str] = []
        self.graph = None
        self.metadata: dict[str, Any] = {}
        self.workspace_holders = 0
        self.hold_workspace = VllmEnv.hold_workspace.__get__(self)

    def drop_workspace(self) -> None:
        self.events.append("workspace dropped")
