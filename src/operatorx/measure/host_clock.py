"""Timing on the CPU device: the host clock around each call. No GPU is involved, and rows say so.

A host-clock sample is only the call's time while the call's threads had the CPU. On a busy
machine a sample can include time the threads sat runnable on a run queue while another process
ran; the run's spread cannot show this (a 2-core machine under load reported 7,985 µs ± 0.5% for
a ~500 µs call). So every sample is judged by measure/cpu_contention.py, in *process* scope: a
CPU op's compute runs on torch's intra-op threads as well as the caller, and any of them waiting
for a CPU delays the call. The CPU device's calls are compute and do not block, so "lost the CPU"
is simply: the process's threads spent more than 5% of the sample's wall time waiting on a run
queue (schedstat), or, without schedstat, used less than one CPU's worth of it.

A contended sample is dropped and counted (`contended_samples_dropped`), as a starved GPU call is;
the stopping rule counts only clean samples, while the time budget counts them all. When the budget
ends with fewer clean samples than `min_samples` (none, or a few: a number from one clean sample
would be reported under a stop reason that promises at least `min_samples`), every sample is kept,
the contended ones counted (`contended_samples_kept`), the stop reason is the one of all samples,
and the row is flagged (`cpu_contended`, `cpu_contended_why`): the number is what was seen, never
passed off as clean. A measurement whose samples were mostly contended is flagged too, with its counts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Optional

from operatorx.measure.cpu_contention import ContentionProbe
from operatorx.measure.l2 import L2Flusher
from operatorx.measure.loop import GiveUp, capped_stop, stop_reason, warmup
from operatorx.measure.measurement import Measurement
from operatorx.measure.record import HostClockRecord
from operatorx.measure.settings import TimingSettings
from operatorx.measure.stats import summarize

__all__ = ["HostClockTiming"]


class HostClockTiming:
    method = "host_clock/perf_counter"

    def __init__(self, settings: TimingSettings, *, prefer_schedstat: bool = True):
        self.settings = settings
        self.prefer_schedstat = prefer_schedstat    # False forces the CPU-time fallback (tests it)
        # The timer protocol (run/case.py `Timer`) has a flusher that callers flush around traced
        # calls; the CPU has no L2 state to produce, so it is the warm (do-nothing) one.
        self.flusher = L2Flusher("warm", None)

    def measure(self, fn: Callable[[], Any], pause_s: float = 0.0,
                give_up: Optional[GiveUp] = None) -> Measurement[HostClockRecord]:
        s = self.settings
        # first: the intra-op pool exists before the probe lists threads
        calls, warm_s, _ = warmup(fn, lambda: None, s, rest_s=pause_s)
        clean_us: list[float] = []
        contended_us: list[float] = []
        every_us: list[float] = []
        start = time.perf_counter()
        reason = None
        with ContentionProbe("process", prefer_schedstat=self.prefer_schedstat) as probe:
            count = probe.count()
            while reason is None:
                before = probe.read()
                t0 = time.perf_counter_ns()
                fn()
                wall_ns = time.perf_counter_ns() - t0
                after = probe.read()
                contended, lost_ns = probe.judge(wall_ns, before, after)
                count.add(contended, wall_ns, lost_ns)
                (contended_us if contended else clean_us).append(wall_ns / 1e3)
                every_us.append(wall_ns / 1e3)
                if pause_s > 0:
                    time.sleep(pause_s)
                elapsed = time.perf_counter() - start
                reason = stop_reason(clean_us, elapsed, s) or capped_stop(give_up, start, len(clean_us))
                if reason is None:
                    # the budget (time, sample count) is spent on every sample, contended or not:
                    # a machine that never frees the CPU must not keep the case sampling forever
                    spent = stop_reason(every_us, elapsed, s)
                    reason = spent if spent != "noise_target" else None
        samples_us = clean_us
        if len(clean_us) < s.min_samples:
            # too few clean samples for the stopping rule's promise: the number is from all of them,
            # contended ones included and flagged, and the reason is the one all of them reached
            samples_us = every_us
            reason = stop_reason(every_us, elapsed, s) or reason
        kept = len(contended_us) if samples_us is every_us else 0
        few = (f"only {len(clean_us)} clean {'sample was' if len(clean_us) == 1 else 'samples were'} left, fewer "
               f"than min_samples ({s.min_samples})") if clean_us else None
        v = count.verdict("samples", dropped=len(contended_us) - kept, kept=kept, in_number=len(samples_us),
                          no_clean_set=few)
        record = HostClockRecord(l2_state="n/a (cpu)", spin=False, contention_signal=v.signal,
                                 contended_samples_dropped=v.dropped, contended_samples_kept=v.kept,
                                 cpu_wait_fraction=v.wait_fraction, cpu_contended=v.contended, **v.why_field())
        return Measurement(method=self.method, clock="host", samples_us=samples_us,
                           summary=summarize(samples_us), warmup_calls=calls, warmup_s=warm_s,
                           stop_reason=reason, details=record)
