"""Where a case's kept device memory was allocated: torch's allocator history, read back per case.

    python bench/memory_origin.py attn_small 7,18 [MIN_MIB]

Runs the listed cases of a testlist through the vllm backend with `--rank-local`, in this process and as a
worker runs them (run/job.py, then the memory check), with torch's CUDA allocator recording every
allocation and its Python stack. After each case it prints the device growth the worker would read and,
for each block still allocated that the case allocated (MIN_MIB, default 4, or more), its size and the
innermost Python frames: the vLLM code that kept it. The question it answers (§34): which allocation is
the 256 MiB the first ratio-4 dsv4_attn case keeps for the process's life.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch

from operatorx.run import RunConfig
from operatorx.run.job import JobSpec, build_job
from operatorx.run.memory_watch import MemoryWatch
from operatorx.run.worker import finish_row
from operatorx.spec import load_testlist
from operatorx.spec.testlist import resolve_testlist

_MIB = 2**20


@dataclass(frozen=True)
class LiveBlock:
    """One allocation the history saw made and not freed."""

    addr: int
    size_bytes: int
    frames: list[dict[str, Any]]


def live_blocks(traces: list[dict[str, Any]]) -> dict[int, LiveBlock]:
    """The allocations alive at the end of the recorded history, by address."""
    live: dict[int, LiveBlock] = {}
    for entry in traces:
        action = entry.get("action")
        if action == "alloc":
            live[entry["addr"]] = LiveBlock(entry["addr"], entry["size"], entry.get("frames") or [])
        elif action in ("free_requested", "free_completed"):
            live.pop(entry["addr"], None)
    return live


def where(frames: list[dict[str, Any]], depth: int = 12) -> list[str]:
    """The innermost Python frames outside torch's own allocator wrappers, one line each."""
    shown = [f for f in frames if f.get("filename", "").endswith(".py") and "/torch/" not in f.get("filename", "")]
    return [f"{f['filename'].split('site-packages/')[-1]}:{f['line']} {f['name']}" for f in shown[:depth]]


def main() -> None:
    testlist, wanted = sys.argv[1], [int(i) for i in sys.argv[2].split(",")]
    min_bytes = float(sys.argv[3] if len(sys.argv) > 3 else 4) * _MIB
    cases = load_testlist(resolve_testlist(testlist))
    config = RunConfig(testlist=testlist, backend="vllm", device="cuda", rank_local=True)
    job = build_job(JobSpec(config=config, run_id="memory-origin", testlist=testlist))
    watch = MemoryWatch.for_run(config)
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=2_000_000)
    for index in wanted:
        case = cases[index]
        before = set(live_blocks(torch.cuda.memory._snapshot()["device_traces"][0]))
        row, _ = finish_row(job.run(case, index), watch.after_case(case.type), config.leak_limit_device_mib,
                            config.leak_limit_host_mib)
        torch.cuda.synchronize()
        memory = row.to_json().get("metrics", {}).get("memory", {})
        print(f"case {index} {case.label()[:70]}: {row.status}; device growth "
              f"{memory.get('device_growth_bytes', 0) / _MIB:.1f} MiB; first_use {memory.get('first_use', False)}",
              flush=True)
        kept = [b for a, b in live_blocks(torch.cuda.memory._snapshot()["device_traces"][0]).items()
                if a not in before and b.size_bytes >= min_bytes]
        for block in sorted(kept, key=lambda b: -b.size_bytes):
            print(f"  kept {block.size_bytes / _MIB:.1f} MiB at {block.addr:#x}")
            for line in where(block.frames):
                print(f"      {line}")
    torch.cuda.memory._record_memory_history(enabled=None)


if __name__ == "__main__":
    main()
