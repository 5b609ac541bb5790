"""Does the profiler make the launch gap it reports? (issue 15, benchmarks §22)

A serving engine runs no CUPTI, but every number we report comes from a process that does. This times
the same work with CUDA events only, so the three ways a process can be set up read with one clock:

    none    no CUPTI at all (what an unprofiled process sees)
    after   CUPTI's activity recording started after torch's CUDA context (as the bench processes do)
    first   CUPTI started on a thread before torch's import, recording turned on after the context
            (as a sweep worker does: `activity.open_in_background`)

Each reading is queued behind a GPU sleep (the host is never the one the GPU waits for) between two
events: a chain of 64 one-element adds (µs a kernel, gap included), and the named accuracy cases
(their span, warm L2). The CUPTI modes also print the launch-gap probe (measure/launch_gap.py).

    python bench/gap_events_probe.py --mode none|after|first [--cases fp8_0,fp8_15] [--reps 40]
    python bench/gap_events_probe.py --mode after --toggle 3   # one process, CUPTI's recording paused and
        # resumed in turn (activity_paused): the same readings with and without it, at one level

Run each mode in several fresh processes, interleaved: the level is fixed per process (§21).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))

_CHAIN = 64
_SLEEP_CYCLES = 20_000_000          # ~10 ms at 1.98 GHz: far longer than the host needs to queue a reading


def _events_us(fn: Callable[[], Any], reps: int, per: int = 1) -> tuple[float, float]:
    """(median, min) µs of `fn` between two events, each rep behind a GPU sleep, divided by `per`."""
    import torch

    out = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(_SLEEP_CYCLES)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / per)
    return statistics.median(out), min(out)


def _readings(chain: Callable[[], Any], prepared: dict[str, Any], reps: int) -> str:
    """The chain's µs a kernel and each case's span, events only, as one line's text."""
    med, low = _events_us(chain, reps, _CHAIN)
    out = f"  chain µs/kernel median {med:.3f} min {low:.3f}"
    for name, p in prepared.items():
        med, low = _events_us(p.fn, reps)
        out += f"  {name} median {med:.2f} min {low:.2f}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("none", "after", "first"), required=True)
    ap.add_argument("--cases", default="fp8_0,fp8_15")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--toggle", type=int, default=0, help="rounds of on/off readings in this process")
    args = ap.parse_args()
    if args.mode == "first":
        from operatorx.measure.activity import open_in_background

        open_in_background()
    import torch
    from timing_accuracy import cases

    from operatorx.backends import get_backend

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    if args.mode != "none":
        from operatorx.measure.activity import activity_session

        session = activity_session()
        print(f"session {type(session).__name__}", flush=True)
    x = torch.zeros(1, device="cuda")

    def chain() -> None:
        for _ in range(_CHAIN):
            x.add_(1.0)

    wanted = args.cases.split(",")
    prepared = {name: get_backend("torch", case.type).prepare(case, "cuda")
                for name, case in cases() if name in wanted}
    chain()
    for p in prepared.values():
        p.fn()
    torch.cuda._sleep(2_000_000_000)          # the clocks up before the first reading
    torch.cuda.synchronize()
    if args.toggle:
        from operatorx.measure.activity import activity_paused

        for r in range(args.toggle):
            for state in ("on", "off"):
                line = f"round {r} cupti {state:3s}"
                if state == "off":
                    with activity_paused():
                        line += _readings(chain, prepared, args.reps)
                else:
                    line += _readings(chain, prepared, args.reps)
                print(line, flush=True)
        return
    med, low = _events_us(chain, args.reps, _CHAIN)
    line = f"mode {args.mode:5s}  chain µs/kernel median {med:.3f} min {low:.3f}"
    if args.mode != "none":
        from operatorx.measure.launch_gap import measure_launch_gap
        from operatorx.measure.telemetry import Telemetry

        gap = measure_launch_gap(Telemetry.for_torch_device(0).max_sm_clock_hz())
        line += f"  probe gap {gap.gap_us:.3f} kernel {gap.kernel_us:.3f}" if gap else "  probe none"
    for name, p in prepared.items():
        med, low = _events_us(p.fn, args.reps)
        line += f"  {name} events span median {med:.2f} min {low:.2f}"
    print(line, flush=True)


if __name__ == "__main__":
    main()
