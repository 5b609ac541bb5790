"""First thing to run on the H200 with vLLM installed: catches API mismatches in minutes.

    PYTHONPATH=src:$PYTHONPATH python3 bench/vllm_smoke.py

Each step runs on its own and prints what vLLM selected, or the traceback, then goes on.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests.backends.vllm.cases

from tests.backends.vllm.cases import gemm_case, moe_case  # noqa: E402

RESULTS: dict[str, Any] = {}


def step(name: str, fn: Callable[[], Any]) -> None:
    t0 = time.perf_counter()
    print(f"\n=== {name}", flush=True)
    try:
        out = fn()
        RESULTS[name] = {"ok": True, "seconds": round(time.perf_counter() - t0, 2), "result": out}
        print(json.dumps(out, indent=1, default=str)[:6000], flush=True)
    except BaseException as err:  # noqa: BLE001
        RESULTS[name] = {"ok": False, "error": f"{type(err).__name__}: {err}"[:2000]}
        traceback.print_exc()


def versions() -> dict[str, Any]:
    import torch
    import vllm
    from vllm.platforms import current_platform

    return {"vllm": vllm.__version__, "torch": torch.__version__, "platform": type(current_platform).__name__,
            "capability": str(current_platform.get_device_capability()),
            "VLLM_env": {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}}


def env_setup() -> dict[str, Any]:
    from operatorx.backends.vllm.env import VllmEnv

    env = VllmEnv.get()
    return {"capture_sizes": env.capture_sizes[-3:], "custom_ops": list(env.config.compilation_config.custom_ops)}


def run_case(backend: Any, case: Any) -> dict[str, Any]:
    reason = backend.supports(case, "cuda")
    if reason:
        return {"unsupported": reason}
    prepared = backend.prepare(case, "cuda")
    try:
        check = prepared.check()
        from operatorx.measure.kernels import profile_kernels

        kernels = profile_kernels(prepared.fn)
        return {"check": check.to_json(), "kernels": kernels, "metadata": prepared.metadata}
    finally:
        if prepared.release:
            prepared.release()


def gemm(scheme: str, m: int) -> Callable[[], Any]:
    def go() -> Any:
        from operatorx.backends.vllm import VllmGemm

        return run_case(VllmGemm(), gemm_case(scheme, m=m, n=2048, k=1024))
    return go


def moe(scheme: str, style: str, tokens: int) -> Callable[[], Any]:
    def go() -> Any:
        from operatorx.backends.vllm import VllmMoe

        return run_case(VllmMoe(), moe_case(scheme, style=style, tokens=tokens))
    return go


if __name__ == "__main__":
    step("versions", versions)
    step("env", env_setup)
    step("gemm fp8_block M=16 (graph)", gemm("fp8_block", 16))
    step("gemm fp8_block M=1024 (eager)", gemm("fp8_block", 1024))
    step("gemm fp8_token_channel M=16", gemm("fp8_token_channel", 16))
    step("gemm fp8_tensor_static M=16", gemm("fp8_tensor_static", 16))
    step("gemm bf16 M=16", gemm("bf16", 16))
    step("moe deepseek fp8_block T=8", moe("fp8_block", "deepseek", 8))
    step("moe qwen bf16 T=64", moe("bf16", "qwen", 64))
    step("moe deepseek fp8_block T=1024 (eager)", moe("fp8_block", "deepseek", 1024))
    print("\n=== summary")
    for name, r in RESULTS.items():
        res = r.get("result") or {}
        check = res.get("check", {}) if isinstance(res, dict) else {}
        print(f"{'OK ' if r['ok'] else 'ERR'} {name}: " + (r.get("error", "") or json.dumps(
            {"unsupported": res.get("unsupported")} if "unsupported" in res else
            {"ok": check.get("ok"), "rel_error": check.get("rel_error")}, default=str))[:300])
    out = os.environ.get("OUT")
    if out:
        Path(out, "vllm_smoke.json").write_text(json.dumps(RESULTS, indent=1, default=str))
