"""How fast an idle GPU's SM clock rises under a spin, and how fast it falls when the GPU idles:
what the worker's clock ramp (measure/clock_ramp.py) must cover.

    python bench/clock_ramp_probe.py [--rounds 2]

Each round: 1.2 s of 25 ms spin kernels, one at a time, the SM clock read (NVML) after each; then
0.6 s idle, read every 25 ms. Prints (seconds since the round began, MHz) pairs.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    import pynvml
    import torch

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    top = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)

    def clock() -> int:
        return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))

    torch.cuda.init()
    torch.cuda.synchronize()
    print(f"max {top} MHz; idle at start {clock()} MHz")
    for r in range(args.rounds):
        t0 = time.perf_counter()
        busy: list[tuple[float, int]] = []
        first_max = None
        while time.perf_counter() - t0 < 1.2:
            torch.cuda._sleep(int(0.025 * top * 1e6))
            torch.cuda.synchronize()
            c = clock()
            busy.append((round(time.perf_counter() - t0, 3), c))
            if first_max is None and c >= top:
                first_max = busy[-1][0]
        t1 = time.perf_counter()
        idle: list[tuple[float, int]] = []
        while time.perf_counter() - t1 < 0.6:
            time.sleep(0.025)
            idle.append((round(time.perf_counter() - t1, 3), clock()))
        print(f"round {r}: at max after {first_max} s busy; busy {busy}")
        print(f"round {r}: idle {idle}")


if __name__ == "__main__":
    main()
