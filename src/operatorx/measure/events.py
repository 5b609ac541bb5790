"""Method A: CUDA events around each call, a GPU spin ahead of each batch, an L2 flush before each call.

Why each piece:
- the spin (torch.cuda._sleep) keeps the GPU busy while the host enqueues the batch, so a
  call never waits on its own launch and a µs kernel is not timed as launch latency;
- the flush zeroes an L2-sized buffer, so each call reads its operands from HBM as it would
  in a model, not from the L2 left warm by the previous call;
- events bracket the call alone (the flush sits outside the pair).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Optional

import torch

from operatorx.measure.loop import stop_reason, warmup
from operatorx.measure.measurement import Measurement
from operatorx.measure.settings import TimingSettings
from operatorx.measure.stats import summarize

__all__ = ["EventTiming"]

_SPIN_MARGIN = 1.5          # spin this many times the measured enqueue time
_MAX_SPIN_S = 0.2           # never spin longer than this per batch


class EventTiming:
    method = "cuda_events/spin+flush"

    def __init__(self, settings: TimingSettings, l2_bytes: Optional[int], sm_clock_hz: float):
        self.settings = settings
        self.flush_bytes = 0
        self._flush: Optional[torch.Tensor] = None
        if settings.flush_l2:
            self.flush_bytes = settings.flush_bytes or l2_bytes or 0
            if self.flush_bytes:
                self._flush = torch.empty(self.flush_bytes, dtype=torch.uint8, device="cuda")
        self.sm_clock_hz = sm_clock_hz

    def _enqueue_s(self, fn: Callable[[], Any]) -> float:
        """Host seconds to enqueue one timed iteration (flush, events, call), measured 3 times."""
        worst = 0.0
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            if self._flush is not None:
                self._flush.zero_()
            start.record()
            fn()
            end.record()
            worst = max(worst, time.perf_counter() - t0)
            torch.cuda.synchronize()
        return worst

    def measure(self, fn: Callable[[], Any]) -> Measurement:
        s = self.settings
        calls, warm_s = warmup(fn, torch.cuda.synchronize, s)
        enqueue_s = self._enqueue_s(fn)
        samples_us: list[float] = []
        spins = spin_short = 0
        wall0 = time.perf_counter()
        reason = None
        while reason is None:
            n = min(s.batch_size, s.max_samples - len(samples_us))
            pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
            spin_s = 0.0
            if s.spin:
                spin_s = min(_MAX_SPIN_S, enqueue_s * n * _SPIN_MARGIN)
                torch.cuda._sleep(int(spin_s * self.sm_clock_hz))
                spins += 1
            t0 = time.perf_counter()
            for start, end in pairs:
                if self._flush is not None:
                    self._flush.zero_()
                start.record()
                fn()
                end.record()
            batch_enqueue_s = time.perf_counter() - t0
            torch.cuda.synchronize()
            if s.spin and batch_enqueue_s > spin_s:
                # the GPU may have drained the queue before the host caught up: size the next spin up
                spin_short += 1
                enqueue_s = max(enqueue_s, batch_enqueue_s / n)
            samples_us.extend(start.elapsed_time(end) * 1e3 for start, end in pairs)
            reason = stop_reason(len(samples_us), sum(samples_us) / 1e6, time.perf_counter() - wall0, s)
        details = {"l2_flush": self._flush is not None, "flush_bytes": self.flush_bytes, "spin": s.spin,
                   "spins": spins, "spin_short_batches": spin_short, "enqueue_us_per_call": enqueue_s * 1e6,
                   "batch_size": s.batch_size}
        return Measurement(method=self.method, clock="device", samples_us=samples_us,
                           summary=summarize(samples_us), warmup_calls=calls, warmup_s=warm_s,
                           stop_reason=reason, details=details)
