"""`py:` backends for checking `ab`'s verdicts on the GPU (issue 32):

    --b py:bench/planted.py:linear            F.linear on the torch backend's seeded inputs: identical code
    --b "py:bench/planted.py:slower[pct=2]"   the same, then a GPU spin of pct % of the call's own time

`slower` measures its call while preparing (CUDA events, median of 50 after a warmup), then the call
with the shortest spin after it, and sizes a `torch.cuda._sleep` so the pair takes `pct` % longer than
the call alone. Where `pct` % of the call is shorter than the shortest extra kernel (its launch gap
included: ~2.5 µs), the planted slowdown is that kernel; `planted_pct` in the side's metadata says
what was planted, measured by the same events.
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

from operatorx.backends import Unsupported
from operatorx.backends.py_file import gemm_inputs


def _inputs(case, device):
    if case.type != "gemm" or device != "cuda":
        raise Unsupported("planted backends: CUDA GEMMs only")
    return gemm_inputs(case, device)


def linear(case, device):
    x = _inputs(case, device)
    return lambda: F.linear(x["a"], x["b"], x["bias"])


def _call_us(fn, calls: int = 50) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def _spin_cycles_per_us() -> float:
    """What `torch.cuda._sleep` spins per µs at the clock the GPU holds now (right after work)."""
    cycles = 2_000_000
    us = _call_us(lambda: torch.cuda._sleep(cycles), calls=5)
    return cycles / us


def slower(case, device, pct=2.0):
    """F.linear then a spin sized so that the pair takes `pct` % longer than F.linear alone, where
    a kernel that short can exist; else the shortest spin (its cost recorded: `planted_pct`)."""
    from operatorx.backends import Check, Prepared

    x = _inputs(case, device)

    def op():
        return F.linear(x["a"], x["b"], x["bias"])

    def with_spin(cycles):
        def fn():
            out = op()
            torch.cuda._sleep(cycles)
            return out
        return fn

    key = (case.key(), float(pct))
    if key not in _PLANTED:              # sized once per case: every placement copy plants the same spin
        base_us = _call_us(op)
        overhead_us = _call_us(with_spin(0)) - base_us     # the shortest extra kernel, its gap included
        extra_us = max(0.0, base_us * float(pct) / 100 - overhead_us)
        cycles = int(extra_us * _spin_cycles_per_us())
        planted_us = _call_us(with_spin(cycles)) - base_us
        _PLANTED[key] = (cycles, {"planted_base_us": round(base_us, 3), "planted_us": round(planted_us, 3),
                                  "planted_pct": round(100 * planted_us / base_us, 2),
                                  "shortest_extra_kernel_us": round(overhead_us, 3), "spin_cycles": cycles})
    cycles, metadata = _PLANTED[key]
    return Prepared(fn=with_spin(cycles), check=lambda: Check.not_checked("planted: F.linear plus a spin"),
                    metadata=dict(metadata))


_PLANTED: dict = {}
