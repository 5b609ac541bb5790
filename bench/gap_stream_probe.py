"""What sets the launch-gap level of a multi-kernel call? (issue 15, benchmarks §17, §21)

A process's multi-kernel calls keep one level of GPU idle time between their kernels (fp8_0: about
8.3 or 9.4 µs over nine boundaries), and a second timer built in the same process raised it by a step.
This times the same prepared calls, in one process and with one timer, on several streams (torch's
default stream, new streams of either priority), with the operands prepared again after a padding
block, and with a second timer, printing span, busy and their difference (the gaps) for each:

    python bench/gap_stream_probe.py [--cases fp8_0,fp8_15,perf7] [--repeats 3]
    python bench/gap_stream_probe.py --cases perf7 --plan d,d,d,s1,s1,s2,d,d   # one measurement each, on
        # the stream named (d: torch's default; sN: a new stream, made at first use), kernel by kernel;
        # tokens that measure nothing: m (256 MiB allocated and kept), zN (a fill on stream sN),
        # bN (a small bf16 F.linear on stream sN), g (the process's launch gap, measure/launch_gap.py);
        # --plan-l2 cold_clean,warm times each token in both

Run it in several fresh processes: a source that varies inside one process varies here; one that is
fixed per process shows one value per process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))


def _measure(timer: Any, fn: Any, repeats: int) -> tuple[float, float, int]:
    """(span µs, busy µs, kernels a call), medians over `repeats` measurements."""
    spans, busys, kernels = [], [], 0
    for _ in range(repeats):
        m = timer.measure(fn)
        spans.append(m.latency_us)
        busys.append(float(m.details.get("busy_us_median") or m.latency_us))
        calls = [c for c in (getattr(m.last_batch, "calls", None) or []) if c.activities]
        kernels = len(calls[0].activities) if calls else 0
    return statistics.median(spans), statistics.median(busys), kernels


def _plan(prepared: dict[str, Any], plan: list[str], timers: dict[str, Any]) -> None:
    """One measurement per token of `plan`, printing each kernel's median duration and the median
    start-to-previous-end offset between consecutive kernels (negative: they overlapped)."""
    import time

    import torch

    streams: dict[str, Any] = {"d": torch.cuda.current_stream()}
    t0 = time.perf_counter()
    kept = []
    for name, p in prepared.items():
        for i, token in enumerate(plan):
            if token == "g":
                from operatorx.measure.launch_gap import measure_launch_gap
                from operatorx.measure.telemetry import Telemetry

                gap = measure_launch_gap(Telemetry.for_torch_device(0).max_sm_clock_hz())
                print(f"{name:7s} #{i:2d} g   t {time.perf_counter() - t0:6.2f} s  {gap}", flush=True)
                continue
            if token == "m" or token[0] in "zb":
                if token == "m":
                    kept.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
                else:
                    with torch.cuda.stream(streams.setdefault("s" + token[1:], torch.cuda.Stream())):
                        x = torch.ones(64, 64, dtype=torch.bfloat16, device="cuda")
                        kept.append(x.fill_(2.0) if token[0] == "z" else torch.nn.functional.linear(x, x))
                torch.cuda.synchronize()
                print(f"{name:7s} #{i:2d} {token}", flush=True)
                continue
            stream = streams.setdefault(token, torch.cuda.Stream())
            for l2_state, timer in timers.items():
                with torch.cuda.stream(stream):
                    m = timer.measure(p.fn)
                _kernel_line(name, f"{i:2d} {token:3s} {l2_state:10s}", time.perf_counter() - t0, m)


def _kernel_line(name: str, label: str, t_s: float, m: Any) -> None:
    """Print one measurement kernel by kernel (durations, offsets between consecutive kernels)."""
    calls = [c.activities for c in (getattr(m.last_batch, "calls", None) or []) if c.activities]
    width = min(len(a) for a in calls) if calls else 0
    durations = [statistics.median(a[k].end_ns - a[k].start_ns for a in calls) / 1e3 for k in range(width)]
    offsets = [statistics.median(a[k].start_ns - a[k - 1].end_ns for a in calls) / 1e3
               for k in range(1, width)]
    names = "|".join(a.name[:28] for a in calls[0][:3]) if calls else ""
    print(f"{name:7s} #{label} t {t_s:6.2f} s  span {m.latency_us:7.2f}  "
          f"busy {float(m.details.get('busy_us_median') or 0):7.2f}  kernels "
          f"{' '.join(f'{d:.2f}' for d in durations)}  offsets {' '.join(f'{o:+.2f}' for o in offsets)}  "
          f"{names}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="fp8_0,fp8_15,perf7")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pads-mib", default="37,74,150")
    ap.add_argument("--plan-l2", default="cold_clean", help="L2 states each --plan token is timed in")
    ap.add_argument("--plan", default="", help="one measurement per token, on that stream, kernel by kernel")
    ap.add_argument("--cupti-first", action="store_true",
                    help="start CUPTI on a thread before torch's import, as a sweep worker does")
    args = ap.parse_args()
    if args.cupti_first:
        from operatorx.measure.activity import open_in_background

        open_in_background()
    import torch
    from timing_accuracy import cases

    from operatorx.backends import get_backend
    from operatorx.measure.device_timer import device_timer
    from operatorx.measure.settings import TimingSettings
    from operatorx.measure.telemetry import Telemetry

    clock = Telemetry.for_torch_device(0).max_sm_clock_hz()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    settings = TimingSettings(mode="kernels", l2_state="cold_clean")
    timer = device_timer(settings, l2, clock)
    wanted = args.cases.split(",")
    chosen = [(name, case) for name, case in cases() if name in wanted]
    prepared = {name: get_backend("torch", case.type).prepare(case, "cuda") for name, case in chosen}
    for p in prepared.values():
        p.fn()
    torch.cuda._sleep(2_000_000_000)          # the clocks up before the first reading
    if args.plan:
        timers = {state: timer if state == "cold_clean" else
                  device_timer(TimingSettings(mode="kernels", l2_state=state), l2, clock)  # type: ignore[arg-type]
                  for state in args.plan_l2.split(",")}
        _plan(prepared, args.plan.split(","), timers)
        return
    streams = {"default": torch.cuda.current_stream(), "new_1": torch.cuda.Stream(),
               "new_2": torch.cuda.Stream(), "high_prio": torch.cuda.Stream(priority=-1)}

    def line(label: str, name: str, fn: Any, t: Any = timer) -> None:
        span, busy, kernels = _measure(t, fn, args.repeats)
        print(f"{name:7s} {label:22s} kernels {kernels:2d}  span {span:8.2f}  busy {busy:8.2f}  "
              f"gaps {span - busy:6.2f} µs", flush=True)

    for name, p in prepared.items():
        for label, stream in streams.items():
            with torch.cuda.stream(stream):
                line(f"stream {label}", name, p.fn)
        line("default again", name, p.fn)
    keep = []
    for pad_mib in (int(x) for x in args.pads_mib.split(",")):
        keep.append(torch.empty(pad_mib << 20, dtype=torch.uint8, device="cuda"))
        for name, case in chosen:
            p = get_backend("torch", case.type).prepare(case, "cuda")
            p.fn()
            line(f"prepared after +{pad_mib} MiB", name, p.fn)
    second = device_timer(settings, l2, clock)
    for name, p in prepared.items():
        line("second timer", name, p.fn, second)
        line("first timer again", name, p.fn)


if __name__ == "__main__":
    main()
