"""`--timing events`: a CUDA event pair around each call, a GPU spin ahead of each batch, the L2
flush of the declared state before each call.

Kept selectable to compare with kernel-level timing and for platforms without CUPTI. Its
known bias: the two event records are timed with the call, which matters for µs kernels
(docs/benchmarks.md, section 6, has the numbers).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Optional

import torch

from operatorx.measure.l2 import L2Flusher
from operatorx.measure.loop import GiveUp, capped_stop, stop_reason, warmup
from operatorx.measure.measurement import Measurement
from operatorx.measure.record import EventsRecord
from operatorx.measure.settings import TimingSettings
from operatorx.measure.stats import summarize

__all__ = ["EventTiming"]

_SPIN_MARGIN = 1.5          # spin this many times the measured enqueue time
_MAX_SPIN_S = 0.2           # never spin longer than this per batch


class EventTiming:
    method = "cuda_events"

    def __init__(self, settings: TimingSettings, flusher: L2Flusher, sm_clock_hz: float):
        self.settings = settings
        self.flusher = flusher
        self.sm_clock_hz = sm_clock_hz

    def _enqueue_s(self, fn: Callable[[], Any]) -> float:
        """Host seconds to enqueue one timed iteration (flush, events, call), the worst of 3."""
        worst = 0.0
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            self.flusher.flush()
            start.record()
            fn()
            end.record()
            worst = max(worst, time.perf_counter() - t0)
            torch.cuda.synchronize()
        return worst

    def measure(self, fn: Callable[[], Any], pause_s: float = 0.0,
                give_up: Optional[GiveUp] = None) -> Measurement[EventsRecord]:
        from operatorx.measure.activity import activity_paused

        with activity_paused():     # CUPTI's API tracing (the L2 probe opened it) would slow every launch
            return self._measure(fn, pause_s, give_up)

    def _measure(self, fn: Callable[[], Any], pause_s: float, give_up: Optional[GiveUp]) -> Measurement[EventsRecord]:
        s = self.settings
        calls, warm_s, call_s = warmup(fn, torch.cuda.synchronize, s, rest_s=pause_s, rest_long_calls=True)
        pause_s = pause_s or s.rested_pause_s(call_s)       # a long call is timed rested from the first attempt
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
                spin_s = min(_MAX_SPIN_S, enqueue_s * (1 if pause_s > 0 else n) * _SPIN_MARGIN)
            t0 = time.perf_counter()
            for i, (start, end) in enumerate(pairs):
                if spin_s and (i == 0 or pause_s > 0):
                    torch.cuda._sleep(int(spin_s * self.sm_clock_hz))
                    spins += 1
                self.flusher.flush()
                start.record()
                fn()
                end.record()
                if pause_s > 0:
                    torch.cuda.synchronize()
                    time.sleep(pause_s)
            batch_enqueue_s = time.perf_counter() - t0
            torch.cuda.synchronize()
            if s.spin and pause_s == 0 and batch_enqueue_s > spin_s:
                # the GPU may have drained the queue before the host caught up: size the next spin up
                spin_short += 1
                enqueue_s = max(enqueue_s, batch_enqueue_s / n)
            samples_us.extend(start.elapsed_time(end) * 1e3 for start, end in pairs)
            reason = (stop_reason(samples_us, time.perf_counter() - wall0, s)
                      or capped_stop(give_up, wall0, len(samples_us)))
        record = EventsRecord(l2_state=self.flusher.state, flush_bytes=self.flusher.flush_bytes,
                              flush_launch=self.flusher.launch, spin=s.spin, spins=spins,
                              spin_short_batches=spin_short, enqueue_us_per_call=enqueue_s * 1e6,
                              batch_size=s.batch_size, pause_s=pause_s, window_start_s=wall0)
        return Measurement(method=self.method, clock="device", samples_us=samples_us,
                           summary=summarize(samples_us), warmup_calls=calls, warmup_s=warm_s,
                           stop_reason=reason, details=record)
