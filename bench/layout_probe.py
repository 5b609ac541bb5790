"""Does where a case's tensors lie in device memory move its cold-L2 time? (issue 15)

Two runs of the same 1,000 gemm cases from one build agreed per case (single kernels p95 0.84%), but
against a build that only built its flush buffer earlier in the worker's start, single-kernel GEMMs
moved up to 11% (benchmarks §20). This times a few of those shapes with their operands placed at
different offsets (a padding allocation made first), in one process, with one timer:

    python bench/layout_probe.py [--pads-mib 0,2,4,8,16,64,130] [--shapes 256x7168x4096,2048x256x7168]
"""

from __future__ import annotations

import argparse
import functools
import statistics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pads-mib", default="0,2,4,6,8,16,64,130")
    ap.add_argument("--shapes", default="256x7168x4096,2048x256x7168,1x6144x1536,4096x256x7168")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    from operatorx.measure.device_timer import device_timer
    from operatorx.measure.settings import TimingSettings
    from operatorx.measure.telemetry import Telemetry

    clock = Telemetry.for_torch_device(0).max_sm_clock_hz()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    timers = {state: device_timer(TimingSettings(mode="kernels", l2_state=state), l2, clock)
              for state in ("cold_clean", "warm")}
    torch.cuda._sleep(2_000_000_000)          # the clocks up before the first case
    for shape in args.shapes.split(","):
        m, n, k = (int(x) for x in shape.split("x"))
        for pad_mib in (int(p) for p in args.pads_mib.split(",")):
            pad = torch.empty(pad_mib << 20, dtype=torch.uint8, device="cuda") if pad_mib else None
            a = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda")
            op = functools.partial(F.linear, a, w)
            out = {state: statistics.median(timer.measure(op).latency_us for _ in range(args.repeats))
                   for state, timer in timers.items()}
            print(f"{shape:16s} pad {pad_mib:4d} MiB  a@{a.data_ptr() % (64 << 20) >> 10:6d} KiB "
                  f"w@{w.data_ptr() % (64 << 20) >> 10:6d} KiB (mod 64 MiB)  cold_clean {out['cold_clean']:8.2f} µs  "
                  f"warm {out['warm']:8.2f} µs", flush=True)
            del op, a, w, pad


if __name__ == "__main__":
    main()
