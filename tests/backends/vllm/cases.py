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
    "fp8_tensor_static": (fp8("fp32", True, [-1, -1]), fp8("fp32", True, [-1, -1])),
    "fp8_tensor_dynamic": (fp8("fp32", False, [-1, -1]), fp8("fp32", True, [-1, -1])),
    "fp8_token_channel": (fp8("fp32", False, [1, -1]), fp8("fp32", True, [-1, 1])),
    "fp8_token_tensor": (fp8("fp32", False, [1, -1]), fp8("fp32", True, [-1, -1])),
    "mxfp8": (fp8("ue8m0", False, [1, 32]), fp8("ue8m0", True, [1, 32])),
    "mxfp4_w4a16": (BF16, {"dtype": "e2m1", "scale": scale("ue8m0", True, [1, 32])}),
    "nvfp4": ({"dtype": "e2m1", "scale": scale("e4m3", False, [1, 16]), "scale2": scale("fp32", True, [-1, -1])},
              {"dtype": "e2m1", "scale": scale("e4m3", True, [1, 16]), "scale2": scale("fp32", True, [-1, -1])}),
}


def gemm_case(scheme: str, m: int = 16, n: int = 512, k: int = 512, **extra: Any) -> Case:
    a, b = SCHEMES[scheme]
    return Case.model_validate({"type": "gemm", "args": {"m": m, "n": n, "k": k, "a": a, "b": b, **extra}})


def moe_case(scheme: str, style: str = "deepseek", tokens: int = 8, routing: Optional[dict[str, Any]] = None,
             num: int = 16, top_k: int = 4, hidden: int = 512, inter: int = 256) -> Case:
    a, w = SCHEMES[scheme]
    experts = {"num": num, "top_k": top_k, "inter": inter, "a1": a, "w1": w, "w2": w, "a2": a}
    args: dict[str, Any] = {"tokens": tokens, "hidden": hidden, "experts": experts,
                            "activation": {"kind": "silu", "gated": True},
                            "routing": routing or {"distribution": "natural", "seed": 0}}
    if style == "deepseek":
        args["router"] = {"gate": {"dtype": "bf16"}, "scoring": "sigmoid", "bias": True, "renormalize": True,
                          "scale": 2.5, "select": {"kind": "grouped_topk", "groups": 4, "topk_groups": 2}}
        args["shared"] = {"count": 1, "inter": inter, "a1": a, "w1": w, "w2": w}
    else:
        args["router"] = {"gate": {"dtype": "bf16"}, "scoring": "softmax", "select": {"kind": "topk"},
                          "renormalize": False}
        args["shared"] = {"count": 1, "inter": inter, "a1": a, "w1": w, "w2": w, "gate": "sigmoid"}
    return Case.model_validate({"type": "moe", "args": args})
