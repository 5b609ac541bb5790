"""Where a case's time goes inside a worker: cProfile over the worker's own loop, in this process.

    python bench/profile_run.py gemm 300 [SKIP_ABOVE_GFLOP]

The sweep's workers are separate processes, so this builds the same job a GPU worker builds
(`run/job.py`) and runs its cases here, each as the worker does: the case, then the memory
check and the row's JSON. Cases above SKIP_ABOVE_GFLOP (default: none skipped) are left out, so
the power-capped prefill GEMMs and their retries do not hide the per-case overhead.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

from operatorx.run import RunConfig
from operatorx.run.job import JobSpec, build_job
from operatorx.run.memory_watch import MemoryWatch
from operatorx.run.worker import finish_row
from operatorx.spec import load_testlist
from operatorx.spec.testlist import resolve_testlist

testlist, limit = sys.argv[1], int(sys.argv[2])
skip_gflop = float(sys.argv[3]) if len(sys.argv) > 3 else float("inf")
device = sys.argv[4] if len(sys.argv) > 4 else "cuda"
cases = [c for c in load_testlist(resolve_testlist(testlist))[:limit] if c.flops() <= skip_gflop * 1e9]
config = RunConfig(testlist=testlist, device=device)
job = build_job(JobSpec(config=config, run_id="profile", testlist=testlist))   # L2 probe, CUPTI start
watch = MemoryWatch.for_run(config)
job.run(cases[0], 0)                                                             # first-op warmup


def loop() -> list[str]:
    statuses = []
    for i, case in enumerate(cases):
        row, _ = finish_row(job.run(case, i), watch.after_case(case.type), config.leak_limit_device_mib,
                            config.leak_limit_host_mib)
        row.to_json()
        statuses.append(row.status)
    return statuses


profiler = cProfile.Profile()
t0 = time.perf_counter()
profiler.enable()
statuses = loop()
profiler.disable()
wall = time.perf_counter() - t0
print(f"{len(cases)} cases in {wall:.1f} s = {len(cases) / wall:.1f} cases/s "
      f"({statuses.count('ok')} ok, {statuses.count('unsupported')} unsupported)")
stats = pstats.Stats(profiler)
stats.sort_stats("cumulative").print_stats(45)
stats.sort_stats("tottime").print_stats(30)
