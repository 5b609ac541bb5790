"""Where a run's wall time goes (cProfile over `run_testlist`), to find what limits cases/s.

    python bench/profile_run.py gemm 120      # testlist, --limit
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

from operatorx.run import RunConfig, run_testlist

testlist, limit = sys.argv[1], int(sys.argv[2])
tmp = Path(tempfile.mkdtemp())
config = RunConfig(testlist=testlist, limit=limit, db=str(tmp / "ox.db"), results_dir=tmp / "res")
run_testlist(RunConfig(testlist=testlist, limit=3, db=str(tmp / "warm.db"), results_dir=tmp / "res"))  # CUPTI init
profiler = cProfile.Profile()
t0 = time.perf_counter()
profiler.enable()
outcome = run_testlist(config)
profiler.disable()
wall = time.perf_counter() - t0
print(f"{len(outcome.rows)} cases in {wall:.1f} s = {len(outcome.rows) / wall:.1f} cases/s "
      f"({outcome.count('ok')} ok)")
stats = pstats.Stats(profiler)
stats.sort_stats("cumulative").print_stats(45)
stats.sort_stats("tottime").print_stats(25)
