"""Which step of building the timer waits for work already queued on the GPU (a worker builds it
while its clock ramp spins, and a step that synchronizes puts the whole spin on its start).

    python bench/sync_probe.py [--cupti]

Queues 1 s of spin, then times each step and says whether the spin was still running after it.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cupti", action="store_true", help="CUPTI recording on first, as in a worker")
    args = ap.parse_args()
    import torch

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    if args.cupti:
        from operatorx.measure.activity import activity_session

        activity_session()
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    torch.cuda._sleep(2_000_000_000)
    t0 = time.perf_counter()

    def step(name: str, fn) -> object:
        t = time.perf_counter()
        out = fn()
        print(f"{name:28s} {1e3 * (time.perf_counter() - t):8.1f} ms  at {time.perf_counter() - t0:6.3f} s  "
              f"spin still running: {not stream.query()}", flush=True)
        return out

    buf = step("torch.empty 125 MiB", lambda: torch.empty(125 << 20, dtype=torch.uint8, device="cuda"))
    step("zero_", lambda: buf.zero_())
    import triton  # noqa: F401

    step("import triton (done above)", lambda: None)
    from operatorx.measure.l2 import _kernel, discard_l2

    step("discard kernel object", _kernel)
    step("discard_l2 first launch", lambda: discard_l2(buf))
    step("discard_l2 second launch", lambda: discard_l2(buf))
    from operatorx.measure.l2 import L2Flusher

    step("L2Flusher(capture=False)", lambda: L2Flusher("cold_clean", 60 << 20, capture=False))
    torch.cuda.synchronize()
    print(f"spin over at {time.perf_counter() - t0:.3f} s")


if __name__ == "__main__":
    main()
