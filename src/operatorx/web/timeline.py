"""The Case page's kernel timeline, from the row's kernel breakdown (`metrics.profile.kernels`).

A row keeps per kernel name its launches per call and device µs per call (measure/kernels.py), in
the order the names were first launched, not when each kernel started. So the timeline lays the
kernels end to end in that order, each bar as long as its device µs per call (all its launches,
mean over the traced calls): what share of a call each kernel takes, in launch order. Gaps between
kernels and kernels that overlap (other streams) are not in the record and are not drawn; the
page says so (`BASIS`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Optional

from operatorx.report.kernel_class import CLASSES, classify

__all__ = ["TimelineBar", "KernelTimeline", "kernel_timeline", "BASIS"]

BASIS = ("kernels in order of first launch, each bar its device µs per call (all its launches, mean over "
         "the traced calls), laid end to end: gaps between kernels and overlap across streams are not shown")


@dataclass(frozen=True)
class TimelineBar:
    name: str
    kernel_class: str
    start_us: float
    """Sum of the bars before it: where it starts when the kernels are laid end to end."""
    duration_us: float
    launches_per_call: Optional[float]


@dataclass(frozen=True)
class KernelTimeline:
    bars: list[TimelineBar]
    total_us: float
    """Sum of the bars: the call's kernel time with no gap and no overlap."""
    busy_us_median: Optional[float]
    span_us_median: Optional[float]
    basis: str = BASIS

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "classes": CLASSES}


def _number(value: Any) -> Optional[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def kernel_timeline(profile: Any) -> Optional[KernelTimeline]:
    """The timeline of a row's `metrics.profile`; None when it has no kernel with a device time."""
    kernels = profile.get("kernels") if isinstance(profile, dict) else None
    if not isinstance(kernels, list):
        return None
    bars: list[TimelineBar] = []
    at = 0.0
    for k in kernels:
        if not isinstance(k, dict):
            continue
        duration = _number(k.get("device_us_per_call"))
        if duration is None:
            continue
        name = str(k.get("name") or "")
        bars.append(TimelineBar(name=name, kernel_class=classify(name), start_us=at, duration_us=duration,
                                launches_per_call=_number(k.get("count_per_call"))))
        at += duration
    if not bars:
        return None
    return KernelTimeline(bars=bars, total_us=at, busy_us_median=_number(profile.get("busy_us_median")),
                          span_us_median=_number(profile.get("span_us_median")))
