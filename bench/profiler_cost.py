"""What one torch.profiler session costs per timed batch, three ways (issue 7's cases/s target).

A: CPU+CUDA activities with record_function ranges (what measure/trace.py does);
B: CUDA activities only, iteration boundaries taken with time.time_ns() on the host; checks
   that every launch record falls between the boundaries of its own iteration;
C: one session with a schedule, one cycle per batch (on_trace_ready per step).
"""

from __future__ import annotations

import bisect
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from operatorx.measure.l2 import L2Flusher

N = 32
x = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)
w = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
flusher = L2Flusher("cold_clean", torch.cuda.get_device_properties(0).L2_cache_size)


def op():
    return x @ w.t()


def ranged_batch():
    """A spin, then N x [flush, call] under the harness's ranges (as measure/trace.py enqueues them)."""
    torch.cuda._sleep(20_000_000)
    for _ in range(N):
        with record_function("ox.flush"):
            flusher.flush()
        with record_function("ox.call"):
            op()


def session(activities, body):
    """Seconds of each phase of one profiler session around `body`, and its events."""
    t0 = time.perf_counter()
    with profile(activities=activities) as p:
        t1 = time.perf_counter()
        body()
        t2 = time.perf_counter()
        torch.cuda.synchronize()
        t3 = time.perf_counter()
    t4 = time.perf_counter()
    ev = p.profiler.kineto_results.events()
    t5 = time.perf_counter()
    return {"enter": t1 - t0, "enqueue": t2 - t1, "sync": t3 - t2, "exit": t4 - t3, "events": t5 - t4,
            "n_ev": len(ev)}, ev


def a_once():
    return session([ProfilerActivity.CPU, ProfilerActivity.CUDA], ranged_batch)[0]


def b_once():
    bounds = []

    def stamped_batch():
        torch.cuda._sleep(20_000_000)
        for _ in range(N):
            bounds.append(("flush", time.time_ns()))
            flusher.flush()
            bounds.append(("call", time.time_ns()))
            op()
        bounds.append(("end", time.time_ns()))

    phases, ev = session([ProfilerActivity.CUDA], stamped_batch)
    launches = sorted(e.start_ns() for e in ev if e.device_type() == torch.autograd.DeviceType.CPU
                      and e.name().startswith("cu") and "Synchronize" not in e.name())
    # each iteration: 2 flush launches then the op's launches; count launches per host interval
    counts = {"flush": [], "call": []}
    times = [t for _, t in bounds]
    per = [0] * len(bounds)
    outside = 0
    for t in launches:
        k = bisect.bisect_right(times, t) - 1
        if k < 0 or k >= len(bounds) - 1:
            outside += 1
        else:
            per[k] += 1
    for (kind, _), c in zip(bounds[:-1], per[:-1], strict=True):
        counts[kind].append(c)
    return {**phases, "flush_launch_counts": sorted(set(counts["flush"])),
            "call_launch_counts": sorted(set(counts["call"])), "outside": outside,
            "first_launch_minus_first_bound_us": (launches[1] - times[0]) / 1e3 if launches else None}


def c_run(steps=6):
    out = []
    stamps = []

    def ready(p):
        stamps.append(time.perf_counter())
        out.append(len(p.profiler.kineto_results.events()))

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=schedule(wait=0, warmup=0, active=1, repeat=0), on_trace_ready=ready) as p:
        for _ in range(steps):
            t0 = time.perf_counter()
            ranged_batch()
            torch.cuda.synchronize()
            p.step()
            stamps.append(("step", time.perf_counter() - t0))
    return stamps, out


for _ in range(3):
    op()
a_once()
b_once()
for name, fn in (("A cpu+cuda", a_once), ("B cuda-only", b_once)):
    rs = [fn() for _ in range(5)]
    print(name, {k: (round(sum(r[k] for r in rs) / 5 * 1e3, 2) if isinstance(rs[0][k], float) else rs[-1][k])
                 for k in rs[0]})
print("C schedule", c_run())
