"""Where one MoE layer's device time goes, through the torch backend: routing, permutation,
expert GEMMs, activation, combine, shared experts.

Run on a GPU machine:  python bench/moe_profile.py [--tokens 1,8,64,512,2048] [--models deepseek,qwen3,gptoss]
Takes the shipped moe_small cases of DeepSeek-R1, Qwen3-235B and gpt-oss-120b and runs them in
bf16 (the shipped DeepSeek-R1 and gpt-oss layers are fp8-block / MXFP4, which torch cannot run on
sm90: their bf16 variants keep every shape and the router). Each stage of the layer is a
torch.profiler.record_function range; a stage's device time is the kernel time launched inside it.
Latency is the median of CUDA-event timings of the same call without the ranges.
Prints one table; with $OUT set, writes $OUT/moe_profile.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from importlib.resources import files
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from operatorx.backends.torch.moe import TorchMoe, build_layer
from operatorx.spec import Case

MODELS = {"deepseek": "deepseek-ai/DeepSeek-R1-0528/", "qwen3": "Qwen/Qwen3-235B-A22B-Thinking-2507/",
          "gptoss": "openai/gpt-oss-120b/"}
DISTRIBUTIONS = {"natural": "natural", "balanced": "balanced", "single_hot": "single_hot",
                 "zipf1.2": {"kind": "zipf", "s": 1.2}}
#: report columns ← profiler ranges (layer.py / experts.py)
COLUMNS = {"routing": ("moe/router",), "permute": ("moe/permute",),
           "expert_gemms": ("moe/expert_gemm1", "moe/expert_gemm2"), "activation": ("moe/activation",),
           "combine": ("moe/combine", "moe/output"), "shared": ("moe/shared",),
           "latent": ("moe/latent_down", "moe/latent_up")}
BF16 = {"dtype": "bf16"}


def _bf16(args: dict[str, Any]) -> dict[str, Any]:
    a = json.loads(json.dumps(args))
    for slot in ("a1", "w1", "w2", "a2"):
        a["experts"][slot] = BF16
    if a.get("shared"):
        for slot in ("a1", "w1", "w2"):
            a["shared"][slot] = BF16
    return a


def shipped_case(model: str, tokens: int, dist: Any) -> Case:
    cases = json.loads(files("operatorx.testlists").joinpath("moe_small.json").read_text())
    raw = next(c for c in cases if any(s.startswith(MODELS[model]) for s in c["sources"]))
    args = _bf16(raw["args"])
    args["tokens"] = tokens
    args["routing"] = {"distribution": dist, "seed": 0}
    return Case.model_validate({"type": "moe", "args": args, "sources": raw["sources"]})


def _device_us(event: Any) -> float:
    total = getattr(event, "device_time_total", None)
    return float(total if total is not None else event.cuda_time_total)


def profile_case(case: Case, calls: int, warmup: int) -> dict[str, Any]:
    layer = build_layer(case, "cuda", ranges=False)
    for _ in range(warmup):
        layer()
    torch.cuda.synchronize()
    samples = []
    for _ in range(max(calls, 20)):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        layer()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    layer.ranges = True
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(calls):
            layer()
        torch.cuda.synchronize()
    per_range: dict[str, float] = {}
    for ev in prof.events():
        if ev.name.startswith("moe/") and getattr(ev, "device_type", None) != torch.autograd.DeviceType.CUDA:
            per_range[ev.name] = per_range.get(ev.name, 0.0) + _device_us(ev) / calls
    # kernels, memcpy and memset on the device; the ranges' own GPU-side annotations are not work
    kernels_us = sum(e.self_device_time_total for e in prof.key_averages()
                     if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
                     and not e.key.startswith("moe/")) / calls
    _, routed = layer.forward(layer.x)
    load = torch.bincount(routed.ids.reshape(-1), minlength=case.args.experts.num).tolist()
    shares = {col: sum(per_range.get(r, 0.0) for r in ranges) for col, ranges in COLUMNS.items()}
    staged = sum(shares.values())
    shares["other"] = max(0.0, kernels_us - staged)
    del layer
    torch.cuda.empty_cache()
    return {"latency_us": statistics.median(samples), "samples_us": samples, "kernel_us": kernels_us,
            "stage_us": shares, "ranges_us": per_range,
            "experts_hit": sum(1 for c in load[:case.args.experts.num] if c), "max_load": max(load)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--tokens", default="1,8,64,512,2048")
    ap.add_argument("--distributions", default=",".join(DISTRIBUTIONS))
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    opts = ap.parse_args()
    rows: list[dict[str, Any]] = []
    table = Table(title="torch MoE layer: device time by stage (bf16, % of kernel time)")
    for col in ("model", "T", "routing", "hit", "latency µs", *COLUMNS, "other"):
        table.add_column(col, justify="right")
    backend = TorchMoe()
    for model in opts.models.split(","):
        for tokens in (int(t) for t in opts.tokens.split(",")):
            for dname in opts.distributions.split(","):
                case = shipped_case(model, tokens, DISTRIBUTIONS[dname])
                reason = backend.supports(case, "cuda")
                row: dict[str, Any] = {"model": model, "tokens": tokens, "distribution": dname,
                                       "sources": case.sources, "args": case.args.model_dump(exclude_none=True)}
                if reason is not None:
                    row["unsupported"] = reason
                    rows.append(row)
                    table.add_row(model, str(tokens), dname, "-", "unsupported: " + reason[:40])
                    continue
                row.update(profile_case(case, opts.calls, opts.warmup))
                rows.append(row)
                total = row["kernel_us"] or 1.0
                pct = [f"{100 * row['stage_us'][c] / total:.0f}%" for c in (*COLUMNS, "other")]
                table.add_row(model, str(tokens), dname, str(row["experts_hit"]), f"{row['latency_us']:.1f}", *pct)
    Console().print(table)
    out = os.environ.get("OUT")
    if out:
        path = Path(out) / "moe_profile.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name()}
        path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
