"""Which block-FP8 GEMM of the torch mla backend cuBLASLt refuses (benchmarks §29: DeepSeek-V3 16-head decode).

Runs the torch backend's prepare and one call of attn_small's mla cases (or those named by --match) with
F.scaled_mm wrapped: every call's operand shapes, strides and scale shapes are logged, and the first one
that raises is printed with its error; then each failing shape is retried alone with fresh contiguous
operands of the same sizes, to tell a shape limit from an operand-layout one.

    python bench/torch_mla_fp8_probe.py [--match DeepSeek-V3]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import torch.nn.functional as F

from operatorx.backends.registry import get_backend
from operatorx.spec.testlist import load_testlist, resolve_testlist

_real = F.scaled_mm
calls: list[dict[str, Any]] = []


def _desc(t: torch.Tensor) -> dict[str, Any]:
    return {"shape": list(t.shape), "stride": list(t.stride()), "dtype": str(t.dtype).replace("torch.", "")}


def logged(a: torch.Tensor, b: torch.Tensor, scale_a: Any, *rest: Any, **kw: Any) -> torch.Tensor:
    entry = {"a": _desc(a), "b": _desc(b), "scale_a": _desc(scale_a) if isinstance(scale_a, torch.Tensor) else None,
             "scale_b": _desc(rest[1]) if len(rest) > 1 and isinstance(rest[1], torch.Tensor) else None}
    try:
        out = _real(a, b, scale_a, *rest, **kw)
    except Exception as e:  # noqa: BLE001 - the probe reports it
        entry["error"] = str(e).splitlines()[0][:200]
        calls.append(entry)
        raise
    entry["ok"] = True
    calls.append(entry)
    return out


def alone(entry: dict[str, Any]) -> str:
    """The failing call again on fresh operands: a [M, K] row-major a and a column-major [K, N] b."""
    from operatorx.backends.torch.attention.proj import _RECIPE
    from operatorx.backends.torch.scaled_mm import scale_a_layout, scale_b_layout

    m, k = entry["a"]["shape"]
    n = entry["b"]["shape"][1]
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
    sa = scale_a_layout(_RECIPE, torch.ones(m, k // 128, device="cuda"))
    sb = scale_b_layout(_RECIPE, torch.ones(n // 128, k // 128, device="cuda"))
    a_type, b_type = _RECIPE.scaling_types()
    try:
        _real(a, b, sa, a_type, sb, b_type, output_dtype=torch.bfloat16)
        torch.cuda.synchronize()
        return "ok alone"
    except Exception as e:  # noqa: BLE001
        return "fails alone: " + str(e).splitlines()[0][:160]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--match", default="DeepSeek-V3")
    ap.add_argument("--testlist", default="attn_small")
    opts = ap.parse_args()
    F.scaled_mm = logged  # type: ignore[assignment]
    backend = get_backend("torch", "mla")
    assert backend is not None
    for case in load_testlist(resolve_testlist(opts.testlist)):
        if case.type != "mla" or opts.match not in " ".join(case.sources):
            continue
        calls.clear()
        label = f"{case.sources[0]} {[(g.count, g.q) for g in case.args.batch.groups]}"
        try:
            prepared = backend.prepare(case, "cuda")
            prepared.fn()
            torch.cuda.synchronize()
            status = "ok"
            prepared.release()
        except Exception as e:  # noqa: BLE001
            status = "error: " + str(e).splitlines()[0][:160]
        shapes = sorted({(tuple(c["a"]["shape"]), tuple(c["b"]["shape"]), "error" in c) for c in calls})
        print(json.dumps({"case": label, "status": status, "gemms": [list(s) for s in shapes]}))
        for c in calls:
            if "error" in c:
                print(json.dumps({"failing": c, "retry": alone(c)}))


if __name__ == "__main__":
    main()
