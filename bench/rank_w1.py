"""The multi-rank path with W=1 against the plain path, in one worker: does the rank timer (a barrier,
then the call's kernel span from the activity records; run/ranks/, measure/rank_timing.py) read what
the single-device timer reads, for the torch gemm and moe? (Issue 30's one-GPU check; its numbers go
to docs/benchmarks.md.)

    python bench/rank_w1.py [--device cuda|cpu] [--backend torch|vllm] [--rounds 3] [--out FILE.json]

One worker job is built as a sweep builds it (CUDA context, CUPTI, the timer, the L2 probe). A
one-rank group is formed (NCCL with NCCL_NVLS_ENABLE=0 on CUDA, gloo on the CPU, rendezvous on
127.0.0.1). Each case is then timed `--rounds` times each way, alternating: the plain path
(`CaseRunner.run`: CUPTI kernel spans on CUDA) and the rank path (`run_rank_case` with W=1: the
same torch call, no collective at W=1, each iteration behind the one-element device all_reduce,
its kernel span read from the same records). With `--backend vllm` the rank path builds vLLM's
parallel state on the group (tensor_parallel_size=1) and the role's parallel layer
(`RowParallelLinear` for o_proj, `ColumnParallelLinear` for gate_up_proj, FusedMoE), against
`ReplicatedLinear` / FusedMoE on the plain path; the cases add block-FP8 ones. Prints one line
per case: both medians of latency and busy time and their ratios, and writes every row to `--out` when given.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from operatorx.spec import Case

BF16 = {"dtype": "bf16"}
CASES: list[dict[str, Any]] = [
    {"type": "gemm", "args": {"m": 64, "n": 7168, "k": 2048, "a": BF16, "b": BF16, "out": "bf16"},
     "sources": ["deepseek-ai/DeepSeek-R1-0528/self_attn.o_proj"]},
    {"type": "gemm", "args": {"m": 1024, "n": 4096, "k": 4096, "a": BF16, "b": BF16, "out": "bf16"},
     "sources": ["org/model/mlp.gate_up_proj"]},
    {"type": "moe", "args": {"tokens": 64, "hidden": 2048, "out": "bf16",
                             "experts": {"num": 64, "top_k": 6, "inter": 1408, "w1": BF16, "w2": BF16},
                             "router": {"gate": {"dtype": "bf16"}, "scoring": "softmax", "select": {"kind": "topk"},
                                        "renormalize": False},
                             "activation": {"kind": "silu"}, "routing": {"distribution": "balanced", "seed": 0}},
     "sources": ["deepseek-ai/DeepSeek-V2-Lite/mlp.experts"]},
]
FP8_ACT = {"dtype": "e4m3", "scale": {"dtype": "fp32", "static": False, "group": [1, 128]}}
FP8_BLOCK = {"dtype": "e4m3", "scale": {"dtype": "fp32", "static": True, "group": [128, 128]}}
VLLM_CASES: list[dict[str, Any]] = CASES + [
    {"type": "gemm", "args": {"m": 64, "n": 7168, "k": 2048, "a": FP8_ACT, "b": FP8_BLOCK, "out": "bf16"},
     "sources": ["deepseek-ai/DeepSeek-R1-0528/self_attn.o_proj"]},
    {"type": "gemm", "args": {"m": 1024, "n": 4096, "k": 4096, "a": FP8_ACT, "b": FP8_BLOCK, "out": "bf16"},
     "sources": ["org/model/mlp.gate_up_proj"]},
    {"type": "moe", "args": {"tokens": 64, "hidden": 2048, "out": "bf16",
                             "experts": {"num": 64, "top_k": 6, "inter": 1408, "a1": FP8_ACT, "w1": FP8_BLOCK,
                                         "w2": FP8_BLOCK, "a2": FP8_ACT},
                             "router": {"gate": {"dtype": "bf16"}, "scoring": "softmax", "select": {"kind": "topk"},
                                        "renormalize": False},
                             "activation": {"kind": "silu"}, "routing": {"distribution": "balanced", "seed": 0}},
     "sources": ["deepseek-ai/DeepSeek-V2-Lite/mlp.experts"]},
]
CPU_CASES: list[dict[str, Any]] = [
    {"type": "gemm", "args": {"m": 8, "n": 256, "k": 256, "a": BF16, "b": BF16, "out": "bf16"},
     "sources": ["org/model/mlp.gate_up_proj"]},
    {"type": "moe", "args": {"tokens": 8, "hidden": 256, "out": "bf16",
                             "experts": {"num": 8, "top_k": 2, "inter": 128, "w1": BF16, "w2": BF16},
                             "router": {"gate": {"dtype": "bf16"}, "scoring": "softmax", "select": {"kind": "topk"}},
                             "activation": {"kind": "silu"}, "routing": {"distribution": "natural", "seed": 0}},
     "sources": []},
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--backend", default="torch", choices=("torch", "vllm"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    opts = parser.parse_args()

    import os

    from operatorx.run.config import RunConfig
    from operatorx.run.job import JobSpec, build_job
    from operatorx.run.ranks.assignment import RankAssignment
    from operatorx.run.ranks.gang import collective_timeout_s, free_port
    from operatorx.run.ranks.rank_runner import run_rank_case

    config = RunConfig(testlist="bench-rank-w1", device=opts.device, backend=opts.backend)
    job: Any = build_job(JobSpec(config=config, run_id="bench-rank-w1", testlist="bench-rank-w1"))
    backend = "nccl" if opts.device == "cuda" else "gloo"
    assignment = RankAssignment(rank=0, world=1, split="w1", group="bench-w1#1", port=free_port(), backend=backend,
                                timeout_s=collective_timeout_s(config.case_deadline_s(), backend),
                                workers=["bench"], gpus=[os.environ.get("CUDA_VISIBLE_DEVICES", "0")
                                                         if opts.device == "cuda" else None])
    rows: list[dict[str, Any]] = []
    print(f"{'case':44} {'plain µs':>10} {'rank W=1 µs':>12} {'ratio':>7}  plain method / rank method")
    cases = CPU_CASES if opts.device == "cpu" else VLLM_CASES if opts.backend == "vllm" else CASES
    for i, raw in enumerate(cases):
        case = Case.model_validate(raw)
        plain, ranked, busy_plain, busy_ranked = [], [], [], []
        for _ in range(opts.rounds):
            row = job.run(case, i)
            result = run_rank_case(job.runner, case, i, assignment)
            rrow = result.row
            if row.status != "ok" or rrow is None or rrow.status != "ok":
                print(f"{case.label():44} plain {row.status}: {row.message} | rank {result.status}: {result.message}")
                break
            plain.append(row.latency_us)
            ranked.append(rrow.latency_us)
            if row.busy_us is not None and rrow.busy_us is not None:
                busy_plain.append(row.busy_us)
                busy_ranked.append(rrow.busy_us)
            rows.append({"case": case.label(), "plain": row.to_json(), "rank_w1": rrow.to_json()})
        if plain and ranked:
            p, r = statistics.median(plain), statistics.median(ranked)
            method = f"{rows[-1]['plain']['metrics'].get('method')} / {rows[-1]['rank_w1']['metrics'].get('method')}"
            busy = ""
            if busy_plain:
                bp, br = statistics.median(busy_plain), statistics.median(busy_ranked)
                busy = f"  busy {bp:.2f} / {br:.2f} ({br / bp:.3f})"
            print(f"{case.label():44} {p:10.2f} {r:12.2f} {r / p:7.3f}  {method}{busy}  "
                  f"(each: {', '.join(f'{x:.2f}' for x in plain)} | {', '.join(f'{x:.2f}' for x in ranked)})")
    if opts.out:
        with open(opts.out, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
