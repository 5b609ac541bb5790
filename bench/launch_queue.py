"""How deep the GPU's launch queue is, and what a batch that overflows it does to the spans.

    python bench/launch_queue.py          # on a CUDA machine with the torch backend

Question behind it (issue 15): block-FP8 dynamic-quant GEMMs (about ten kernels a call) took up to
1 s a case in a 1,000-case sweep, most of it GPU spin, with starved calls and spans whose
samples alternated call by call. The hypothesis: the host can queue only so many launches ahead
of the GPU; a batch whose spin asks it to queue more blocks inside a launch until the GPU frees
room, the host's measured enqueue time then grows with the spin (and the next spin with it), and
the calls past that point run paced by the host.

Part 1, capacity: behind a 200 ms GPU spin, launch the same call over and over and find the first
one that blocks the host (> 10 ms): a one-kernel call with a small argument block
(`torch.cuda._sleep`), a one-kernel elementwise op, and one [flush, call] iteration of an FP8 case.
Part 2, regime: time batches of n calls of that FP8 case with a spin long enough for the whole
batch, n below and above the capacity: median span, lag-1 autocorrelation of the spans, starved
calls, host seconds per call.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

SPIN_S = 0.2
CLOCK_HZ = 1.98e9
BLOCKED_S = 10e-3   # a launch that waited this long waited for the spin (a [flush, call] of a
                    # 10-kernel FP8 case takes ~0.5 ms to enqueue; the first add_ ~0.1 ms)


def first_blocked(call: Callable[[], Any], tries: int) -> tuple[int | None, float]:
    """(index of the first call whose enqueue took > BLOCKED_S behind a long spin, host µs a call before it)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda._sleep(int(SPIN_S * CLOCK_HZ))
    stamps = [time.perf_counter()]
    for _ in range(tries):
        call()
        stamps.append(time.perf_counter())
    torch.cuda.synchronize()
    steps = np.diff(stamps)
    blocked = np.nonzero(steps > BLOCKED_S)[0]
    at = int(blocked[0]) if blocked.size else None
    before = steps[:at] if at else steps
    return at, float(np.median(before)) * 1e6


def fp8_case(index: int) -> Any:
    from operatorx.backends import get_backend
    from operatorx.spec import load_testlist, resolve_testlist

    case = load_testlist(resolve_testlist("gemm"))[index]
    prepared = get_backend("torch", case.type).prepare(case, "cuda")
    prepared.fn()
    return case, prepared


def main() -> None:
    import torch

    from operatorx.measure.activity import activity_session
    from operatorx.measure.l2 import L2Flusher

    out: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    flusher = L2Flusher("cold_clean", torch.cuda.get_device_properties(0).L2_cache_size)
    x = torch.zeros(1, device="cuda")
    session = activity_session()
    case_index = int(sys.argv[1]) if len(sys.argv) > 1 else 418
    case, prepared = fp8_case(case_index)
    probe = session.batch(prepared.fn, 4, flusher.flush, int(0.002 * CLOCK_HZ))
    kernels_per_call = statistics.median(len(c.activities) for c in probe.calls)
    iteration_launches = kernels_per_call + 1     # the flush is one graph launch
    out["case"] = {"index": case_index, "label": case.label(), "scheme": case.scheme(),
                   "kernels_per_call": kernels_per_call, "launches_per_iteration": iteration_launches}

    def iteration() -> None:
        flusher.flush()
        prepared.fn()

    calls = {"sleep": (lambda: torch.cuda._sleep(1), 1.0), "add_": (lambda: x.add_(1), 1.0),
             "fp8 iteration": (iteration, iteration_launches)}
    for cupti_on in (True, False):
        (session.resume if cupti_on else session.pause)()
        for name, (fn, launches) in calls.items():
            at, host_us = first_blocked(fn, 6000 if launches == 1 else 1200)
            out.setdefault("capacity", []).append(
                {"call": name, "cupti_on": cupti_on, "first_blocked_call": at,
                 "launches_queued": None if at is None else at * launches, "host_us_per_call": host_us})
            print(out["capacity"][-1], flush=True)
    session.resume()
    session.discard()
    host_s = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(20):
            iteration()
        host_s.append((time.perf_counter() - t0) / 20)
        torch.cuda.synchronize()
    enqueue_s = min(host_s)
    out["enqueue_us"] = enqueue_s * 1e6
    for n in (32, 64, 96, 128, 192, 300, 450):
        spans: list[float] = []
        busy: list[float] = []
        starved = 0
        host_us = []
        lag = []
        for _ in range(5):
            batch = session.batch(prepared.fn, n, flusher.flush, int(1.5 * enqueue_s * n * CLOCK_HZ))
            kept = [c for c in batch.calls if c.activities and not c.starved]
            starved += sum(1 for c in batch.calls if c.activities and c.starved)
            s = np.array([c.span_ns / 1e3 for c in kept])
            spans += list(s)
            busy += [c.busy_ns / 1e3 for c in kept]
            host_us.append(batch.enqueue_s_per_call * 1e6)
            if s.size > 4:
                lag.append(float(np.corrcoef(s[:-1], s[1:])[0, 1]))
        row = {"n": n, "span_us_median": float(np.median(spans)), "busy_us_median": float(np.median(busy)),
               "span_p90_p10_us": float(np.percentile(spans, 90) - np.percentile(spans, 10)),
               "lag1_median": statistics.median(lag) if lag else None, "starved": starved,
               "kept": len(spans), "host_us_per_call_median": statistics.median(host_us)}
        out.setdefault("regime", []).append(row)
        print(row, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
