"""One table-driven summary for every timing strategy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["summarize"]

_STATS = {
    "median": lambda x: np.median(x),
    "mean": lambda x: np.mean(x),
    "min": lambda x: np.min(x),
    "max": lambda x: np.max(x),
    "p10": lambda x: np.percentile(x, 10),
    "p90": lambda x: np.percentile(x, 90),
    "iqr": lambda x: np.percentile(x, 75) - np.percentile(x, 25),
    "std": lambda x: np.std(x, ddof=1) if len(x) > 1 else 0.0,
}


def summarize(samples_us: Sequence[float]) -> dict[str, float]:
    """Summary statistics in µs, plus `n` and the relative noise `cv` (std / mean)."""
    x = np.asarray(samples_us, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no samples to summarize")
    out = {name: float(f(x)) for name, f in _STATS.items()}
    out["n"] = int(x.size)
    out["cv"] = out["std"] / out["mean"] if out["mean"] > 0 else 0.0
    return out
