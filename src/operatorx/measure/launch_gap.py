"""The GPU's launch gap in this process: idle device time between two dependent kernels of one stream.

A multi-kernel call's span is its kernels plus the gaps between them. That gap is not a constant of
the card: each process keeps one level for its life, and the level can differ from one process to
the next, whatever the process's stream, L2 state, operand placement or module loading. A multi-kernel
call's span therefore moves from one process to the next while its busy time does not. The level is
the GPU's, not the profiler's: processes timed with CUDA events only, no CUPTI at all, show it too,
and neither CUPTI's start order nor pinning the process chooses it. Nothing in the process chooses the
level, so it is measured as a condition of the worker, like its clocks: every row carries its worker's
reading, and comparisons can tell a span that moved with it from one that moved with the op.

The probe: a chain of tiny dependent kernels (one-element adds), queued behind a GPU wait so the host
is never the one the GPU waits for, recorded by the process's activity session; the gap is the mean
start-to-previous-end offset over the chain's boundaries, the slowest and fastest tenth left out. It
reads a little below the gaps of the same worker's multi-kernel calls and moves with them worker by
worker. A mean, not a median: kernel timestamps come in steps (32 ns on the H200), and a median of
such steps jumps between neighbouring steps from one reading to the next in one process.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Optional

__all__ = ["LaunchGap", "chain_offsets_ns", "measure_launch_gap", "trimmed_mean"]

_CHAIN_KERNELS = 16         # kernels in one probe call: 15 boundaries
_CHAIN_CALLS = 8            # probe calls in the batch: 120 boundaries in all
_HOLD_S = 50e-3             # the GPU waits this long at most while the host launches the chain. The released
                            # wait ends as soon as the host is done, so only its budget is this long: with a
                            # 2 ms budget the host under Kineto's per-call tracing ran out of it, the GPU
                            # caught up, and the probe read the host's launch pace
_TRIM = 0.1                 # share of offsets left out at each end (a boundary the host was late for)


@dataclass(frozen=True)
class LaunchGap:
    """What the probe read."""

    gap_us: float
    """Trimmed mean of the offsets between consecutive kernels (see the module's docstring)."""
    kernel_us: float
    """Median duration of one probe kernel (a one-element add): a sanity check."""
    boundaries: int
    """Offsets the mean is taken over, before trimming: those of the probe calls the host kept ahead of."""


def chain_offsets_ns(calls: list[list[tuple[int, int]]]) -> list[int]:
    """Start minus the previous kernel's end, for each boundary inside each call's (start, end) list
    (sorted by start here; negative where two kernels overlapped)."""
    offsets: list[int] = []
    for kernels in calls:
        ordered = sorted(kernels)
        offsets.extend(ordered[k][0] - ordered[k - 1][1] for k in range(1, len(ordered)))
    return offsets


def trimmed_mean(values: list[int], trim: float = _TRIM) -> float:
    """Mean of `values` without the lowest and highest `trim` share of them."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    cut = int(len(ordered) * trim)
    kept = ordered[cut:len(ordered) - cut] or ordered
    return sum(kept) / len(kept)


def measure_launch_gap(sm_clock_hz: float, released: bool = True) -> Optional[LaunchGap]:
    """The process's launch-gap level, from one probe batch; None where no call of it counts: no
    kernel recorded, or the host late for every call (a gap then measures the host, not the GPU).
    `released`: behind the host-released wait (measure/host_release.py), else a fixed spin of the
    same budget (`--no-spin` runs build no wait kernel). It costs tens of ms at a worker's start."""
    import torch

    from operatorx.measure.trace import trace_batch

    x = torch.zeros(1, device="cuda")

    def chain() -> None:
        for _ in range(_CHAIN_KERNELS):
            x.add_(1.0)

    chain()
    torch.cuda.synchronize()
    batch = trace_batch(chain, _CHAIN_CALLS, None, int(_HOLD_S * sm_clock_hz), released=released)
    ahead = [c for c in batch.calls if len(c.activities) > 1 and not c.launched_late and not c.starved]
    calls = [[(a.start_ns, a.end_ns) for a in c.activities] for c in ahead]
    offsets = chain_offsets_ns(calls)
    if not offsets:
        return None
    durations = [end - start for kernels in calls for start, end in kernels]
    return LaunchGap(gap_us=trimmed_mean(offsets) / 1e3, kernel_us=statistics.median(durations) / 1e3,
                     boundaries=len(offsets))
