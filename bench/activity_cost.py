"""What one timed batch costs on the host with each activity source, and whether they agree.

    python bench/activity_cost.py            # every source, each in its own process

For each source (`kineto`: one torch.profiler session per batch; `cupti`: one CUPTI session kept
open, recording only the API calls that launch device work; `cupti-all`: the same, recording
every API call), 30 batches of 32 [flush, call] iterations of a 64x2048x2048 bf16 GEMM with
the cold-clean flush: wall seconds per batch (host loop, synchronize, reading the records,
attribution), and the median span and busy time of the calls (the same op on the same GPU: the
sources should agree within noise).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time


def one(source: str) -> dict[str, float]:
    import torch

    from operatorx.measure import activity
    from operatorx.measure.l2 import L2Flusher
    from operatorx.platform import describe_device

    os.environ[activity.ACTIVITY_ENV] = "kineto" if source == "kineto" else "cupti"
    os.environ[activity.API_ENV] = "all" if source == "cupti-all" else "launches"
    session = activity.activity_session()
    a = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    flusher = L2Flusher("cold_clean", describe_device("cuda").l2_bytes)

    def call() -> None:
        torch.matmul(a, b)

    for _ in range(3):                              # start-up (CUPTI or Kineto) and first launches
        session.batch(call, 32, flusher.flush, 2_000_000)
    walls, spans, busys, enqueue_us = [], [], [], []
    for _ in range(30):
        t0 = time.perf_counter()
        batch = session.batch(call, 32, flusher.flush, 2_000_000)
        walls.append(time.perf_counter() - t0)
        enqueue_us.append(batch.enqueue_s_per_call * 1e6)
        spans += [c.span_ns / 1e3 for c in batch.calls if c.activities and not c.starved]
        busys += [c.busy_ns / 1e3 for c in batch.calls if c.activities and not c.starved]
    return {"source": source, "batch_ms_median": 1e3 * statistics.median(walls),
            "batch_ms_p90": 1e3 * sorted(walls)[int(0.9 * len(walls))], "span_us_median": statistics.median(spans),
            "busy_us_median": statistics.median(busys), "calls_kept": len(spans),
            "enqueue_us_per_call_median": statistics.median(enqueue_us)}


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(json.dumps(one(sys.argv[1])))
        sys.exit(0)
    for src in ("kineto", "cupti", "cupti-all"):
        out = subprocess.run([sys.executable, __file__, src], capture_output=True, text=True)
        line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-800:]
        print(f"{src}: {line}", flush=True)
