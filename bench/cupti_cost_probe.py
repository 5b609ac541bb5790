"""What CUPTI's recording costs the host, per call, in a worker-like process (issue 15, benchmarks §22).

A sweep's ok case spends most of its time on the host: on the H200's slower hosts one [flush, call]
is enqueued in 88-110 µs, and `bench/profile_run.py` put 57 µs of it in `F.linear` and ~1.2 ms in
each batch's first launch (the GPU wait). This reads, in one process, with CUPTI's recording on and
paused in turn:

- host µs of one small bf16 `F.linear` (16x4096x4096), of one CUDA-graph replay, of one
  `torch.cuda._sleep` launch;
- host µs of the first launch after a synchronize, and after a synchronize and CUPTI's forced flush
  (what every batch did until benchmarks §22; it now takes the quick flush, `CuptiSession._attributed`);
- with `--hw-trace`, the same with CUPTI's hardware tracing asked for (`activity_enable_hw_trace`),
  and the GPU time of a chain of 64 one-element adds (events), to see whether it lowers the GPU-side
  cost (+0.17-0.25 µs a kernel with the default tracing, benchmarks §22).

    python bench/cupti_cost_probe.py [--hw-trace]
    python bench/cupti_cost_probe.py --flush-study   # the first launch after CUPTI's flush, by flush flag
        # (1 forced, 0 completed buffers only) and activity-buffer size; and whether flag 0 after a
        # synchronize hands back every kernel record
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any


def _host_us(fn: Callable[[], Any], n: int, sync_every: int = 50) -> float:
    """Median host µs of one `fn()` call over `n`, synchronizing every `sync_every` calls."""
    import torch

    out = []
    for i in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
        if i % sync_every == sync_every - 1:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(out)


def _first_launch_us(before: Callable[[], Any], n: int = 30) -> float:
    """Median host µs of a `torch.cuda._sleep(1)` launch right after `before()`."""
    import torch

    out = []
    for _ in range(n):
        torch.cuda.synchronize()
        before()
        t0 = time.perf_counter()
        torch.cuda._sleep(1)
        out.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(out)


def _chain_us(reps: int = 30, kernels: int = 64) -> float:
    """GPU µs a kernel of a chain of one-element adds queued behind a sleep, by events."""
    import torch

    x = torch.zeros(1, device="cuda")
    out = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(4_000_000)
        start.record()
        for _ in range(kernels):
            x.add_(1.0)
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / kernels)
    return statistics.median(out)


def _flush_study(session: Any) -> None:
    """First-launch µs after a synchronize and a flush, by flag and buffer size; records kept by flag 0."""
    import torch

    from operatorx.measure import activity

    session._recording = True
    for flag in (1, 0):
        for size_kib in (8192, 1024, 256, 64):
            activity._BUFFER_BYTES = size_kib << 10       # read by the buffer-request callback at each request
            session._take(forced=True)
            torch.cuda._sleep(1)
            torch.cuda.synchronize()
            us = _first_launch_us(lambda f=flag: session._cupti.activity_flush_all(f))
            launched = 200
            session._take(forced=True)
            for _ in range(launched):
                torch.cuda._sleep(1)
            torch.cuda.synchronize()
            session._cupti.activity_flush_all(flag)
            with session._lock:
                kept = sum(1 for a, _ in session._device if a.name.endswith("spin_kernel(long)") or "spin" in a.name)
                apis = len(session._launch_at)
            print(f"flush flag {flag}  buffer {size_kib:5d} KiB  first launch after sync+flush {us:7.1f} µs  "
                  f"records after {launched} launches + sync + flush: kernels {kept}, launch API {apis}", flush=True)
            session._take(forced=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw-trace", action="store_true")
    ap.add_argument("--flush-study", action="store_true")
    args = ap.parse_args()
    import torch

    from operatorx.measure.activity import CuptiSession

    torch.zeros(1, device="cuda")
    session = CuptiSession(enable=False)
    if args.hw_trace:
        try:
            session._cupti.activity_enable_hw_trace(1)
            print("hw trace: enabled", flush=True)
        except Exception as err:  # noqa: BLE001 - a GPU or CUPTI without it: said, and the rest runs
            print(f"hw trace: refused ({type(err).__name__}: {err})", flush=True)
    session.begin()
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    y = torch.zeros(1 << 20, device="cuda")
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y.add_(1.0)
        with torch.cuda.graph(graph):
            y.add_(1.0)
    torch.cuda.current_stream().wait_stream(s)
    torch.nn.functional.linear(x, w)
    torch.cuda._sleep(2_000_000_000)
    torch.cuda.synchronize()
    if args.flush_study:
        _flush_study(session)
        return
    for state in ("on", "off", "on", "off"):
        if state == "off":
            session.pause()
        else:
            session.resume()
            session._recording = True     # decode as a batch does
        line = f"cupti {state:3s}"
        line += f"  linear {_host_us(lambda: torch.nn.functional.linear(x, w), 300):6.1f} µs"
        line += f"  graph replay {_host_us(graph.replay, 300):6.1f}"
        line += f"  sleep launch {_host_us(lambda: torch.cuda._sleep(1), 300):6.1f}"
        line += f"  first launch after sync {_first_launch_us(lambda: None):7.1f}"
        if state == "on":
            line += f"  after sync+flush {_first_launch_us(lambda: session._take(forced=True)):7.1f}"
        line += f"  chain GPU µs/kernel {_chain_us():.3f}"
        session._take(forced=True) if state == "on" else None
        print(line, flush=True)


if __name__ == "__main__":
    main()
