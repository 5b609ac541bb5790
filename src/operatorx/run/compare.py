"""Compare two outputs of one op: bitwise equal, within tolerance, or different.

Used where two callables should compute the same thing on the same inputs (the two sides of an
A/B, the layers of one op): a speed comparison between different results is not a comparison,
so the outcome is reported next to the numbers.
"""

from __future__ import annotations

from typing import Any

from operatorx.backends.check import REL_ERROR_BOUND

__all__ = ["compare_outputs", "TOLERANCE_REL"]

_TORCH_NAME = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

#: ||x - y||_F / ||y||_F allowed for "within_tolerance", by dtype: the output's rounding.
#: By torch dtype name: the backends' check bounds (backends/check.py), plus float64.
TOLERANCE_REL = {_TORCH_NAME[k]: v for k, v in REL_ERROR_BOUND.items()} | {"float64": 1e-10}
_DEFAULT_REL = 1e-2


def _flat(out: Any) -> list[Any]:
    if isinstance(out, (tuple, list)):
        return [t for x in out for t in _flat(x)]
    return [out]


def compare_outputs(x: Any, y: Any) -> dict[str, Any]:
    """{"result": "bitwise" | "within_tolerance" | "different" | "not_comparable", ...details}.

    Tensors (or tuples/lists of them) are compared element-wise after moving to the CPU.
    """
    import torch

    xs, ys = _flat(x), _flat(y)
    if len(xs) != len(ys):
        return {"result": "not_comparable", "why": f"{len(xs)} outputs vs {len(ys)}"}
    worst: dict[str, Any] = {"result": "bitwise"}
    for i, (a, b) in enumerate(zip(xs, ys, strict=True)):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            if a is None and b is None:
                continue
            return {"result": "not_comparable", "why": f"output {i}: {type(a).__name__} vs {type(b).__name__}"}
        if a.shape != b.shape:
            return {"result": "different", "why": f"output {i}: shape {list(a.shape)} vs {list(b.shape)}"}
        if a.dtype != b.dtype:
            return {"result": "different", "why": f"output {i}: dtype {a.dtype} vs {b.dtype}"}
        a, b = a.detach().cpu(), b.detach().cpu()
        if torch.equal(a, b):
            continue
        bound = TOLERANCE_REL.get(str(a.dtype).removeprefix("torch."), _DEFAULT_REL)
        af, bf = a.double(), b.double()
        rel = float((af - bf).norm() / bf.norm().clamp_min(1e-30))
        max_abs = float((af - bf).abs().max())
        entry = {"result": "within_tolerance" if rel <= bound else "different", "rel_error": rel,
                 "max_abs_error": max_abs, "bound": bound, "output": i}
        if entry["result"] == "different" or rel > worst.get("rel_error", -1.0):
            worst = entry
        if entry["result"] == "different":
            break
    return worst
