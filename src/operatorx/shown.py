"""The metrics a row shows, each declared once: the terminal table, Markdown, CSV, the store's typed
columns and the web pages read these declarations, so a new shown metric is one entry here.

A declaration names the metric's key (its CSV field, store column and page field), its column
title in terminal and Markdown tables, its heading on the pages, its unit, the digits tables
print, and where it lives in a row's document `metrics` (alternative paths, the first present
wins). `stored` marks the metrics that have a typed column in the `rows` table: adding one there
also takes a migration (store/migrations).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["ShownMetric", "SHOWN", "SHOWN_BY_KEY", "shown_values"]


@dataclass(frozen=True)
class ShownMetric:
    key: str
    title: str
    heading: str
    unit: str
    digits: int
    paths: tuple[tuple[str, ...], ...]
    stored: bool = False
    optional: bool = False
    """Shown only where some row has it (busy and host time), not as an empty column."""

    def read(self, metrics: Mapping[str, Any]) -> Optional[float]:
        """The metric's value in a document's `metrics`, or None (absent, not a finite number)."""
        for path in self.paths:
            value: Any = metrics
            for part in path:
                value = value.get(part) if isinstance(value, Mapping) else None
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                return float(value)
        return None

    def to_json(self) -> dict[str, Any]:
        """What a page needs to show the metric's column."""
        return {"key": self.key, "title": self.heading, "unit": self.unit, "digits": self.digits}


SHOWN: tuple[ShownMetric, ...] = (
    ShownMetric("latency_us", "latency_us", "latency µs", "µs", 2, (("latency_us",),), stored=True),
    ShownMetric("busy_us", "busy_us", "busy µs", "µs", 2,
                (("busy_us",), ("timing", "busy_us_median"), ("profile", "busy_us_median")), stored=True,
                optional=True),
    ShownMetric("host_us", "host_us", "host µs", "µs", 2, (("host", "host_us_per_call"),), optional=True),
    ShownMetric("tflops", "TFLOP/s", "TFLOP/s", "TFLOP/s", 1, (("tflops",),), stored=True),
    ShownMetric("gbps", "GB/s", "GB/s", "GB/s", 1, (("gbps",),), stored=True),
    ShownMetric("pct_peak", "% peak", "% peak", "%", 1, (("pct_peak",),), stored=True),
)
SHOWN_BY_KEY = {m.key: m for m in SHOWN}


def shown_values(metrics: Mapping[str, Any], stored_only: bool = False) -> dict[str, Optional[float]]:
    """Every shown metric's value in a document's `metrics`, by key."""
    return {m.key: m.read(metrics) for m in SHOWN if m.stored or not stored_only}
