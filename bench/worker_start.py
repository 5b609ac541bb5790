"""Where a sweep worker's start-up goes (issues 11 and 15): the seconds every run pays before its
first case, on one GPU as on eight, so they bound how far more GPUs can speed a run up.

    python bench/worker_start.py [TOP]      # in a fresh process, as `operatorx run` starts a worker

Prints the interpreter's start to this script, then the job's own laps (`startup_s`, as the sweep
stores them), then cProfile's TOP (default 25) functions by cumulative time inside `build_job`.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time


def main() -> None:
    top = int(sys.argv[1]) if len(sys.argv) > 1 else 25
    t_script = time.perf_counter()
    from operatorx.run.config import RunConfig
    from operatorx.run.job import JobSpec, build_job

    t_imported = time.perf_counter()
    spec = JobSpec(config=RunConfig(testlist="gemm", device="cuda"), run_id="bench-worker-start", testlist="gemm")
    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.enable()
    job = build_job(spec)
    profiler.disable()
    built_s = time.perf_counter() - t0
    print(f"operatorx.run.job import: {t_imported - t_script:.3f} s; build_job: {built_s:.3f} s")
    print("laps (s):", job.info.get("startup_s"))
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
    print("\n".join(line[:160] for line in out.getvalue().splitlines()))


if __name__ == "__main__":
    main()
