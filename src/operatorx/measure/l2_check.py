"""A check, at the start of each CUDA run, that the flushes produce the L2 states they claim.

Without hardware counters the L2 is observed through time: a probe kernel reads a buffer
(a quarter of L2) right after that buffer was read once (so it is in L2) and then the
state's flush ran. Warm: the read hits L2. Cold: it comes from HBM, so it is slower. Cold and
dirty: it also has to write back the flush's dirty lines to make room, so it is slower again.
On the H200 (docs/benchmarks.md) a 15 MiB read took 7.6 / 9.3 / 11.0 µs warm / clean / dirty.
A state is verified when its probe time sits where it must against the other two.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from operatorx.measure.l2 import L2_STATES, L2Flusher
from operatorx.measure.trace import trace_batch

__all__ = ["check_l2_states", "verdicts", "MIN_COLD_OVER_WARM", "MIN_DIRTY_OVER_CLEAN"]

MIN_COLD_OVER_WARM = 1.08
"""A cold probe must take this many times the warm one: the flush evicted the probe's lines."""
MIN_DIRTY_OVER_CLEAN = 1.05
"""After a dirty flush the probe must take this many times the clean-flush time: the clean
flush's discard really left no lines to write back."""
_PROBE_CALLS = 24


def verdicts(probe_us: dict[str, float]) -> dict[str, bool]:
    """Which states the probe times confirm (pure, so the rule is tested without a GPU)."""
    warm, clean, dirty = probe_us["warm"], probe_us["cold_clean"], probe_us["cold_dirty"]
    evicts_clean = clean >= MIN_COLD_OVER_WARM * warm
    evicts_dirty = dirty >= MIN_COLD_OVER_WARM * warm
    dirty_costs = dirty >= MIN_DIRTY_OVER_CLEAN * clean
    return {"warm": evicts_clean and evicts_dirty, "cold_clean": evicts_clean and dirty_costs,
            "cold_dirty": evicts_dirty and dirty_costs}


def check_l2_states(l2_bytes: Optional[int], declared: str, sm_clock_hz: Optional[float]) -> dict[str, Any]:
    """Probe all three states; the result goes into the run's info and each row's `l2_verified`."""
    import torch

    if not l2_bytes:
        return {"declared": declared, "verified": False, "why": "the device's L2 size is unknown"}
    probe = torch.randn(max(l2_bytes // 4 // 2, 1 << 16), dtype=torch.bfloat16, device="cuda")
    read = probe.sum
    probe_us: dict[str, float] = {}
    try:
        for state in L2_STATES:
            flusher = L2Flusher(state, l2_bytes)

            def prime_then_flush(flusher: L2Flusher = flusher) -> None:
                read()
                flusher.flush()

            for _ in range(3):
                prime_then_flush()
                read()
            spin = int(2e-3 * (sm_clock_hz or 2.0e9))
            batch = trace_batch(read, _PROBE_CALLS, prime_then_flush, spin)
            spans = [c.span_ns / 1e3 for c in batch.calls if c.activities and not c.starved]
            probe_us[state] = float(np.median(spans)) if spans else float("nan")
            flusher.release()
    finally:
        del probe
        torch.cuda.empty_cache()
    if any(np.isnan(v) for v in probe_us.values()):
        return {"declared": declared, "verified": False, "probe_us": probe_us, "why": "probe produced no samples"}
    ok = verdicts(probe_us)
    return {"declared": declared, "verified": ok[declared], "states_verified": ok, "probe_us": probe_us,
            "probe_bytes": int(l2_bytes // 4), "cold_over_warm": probe_us["cold_clean"] / probe_us["warm"],
            "dirty_over_clean": probe_us["cold_dirty"] / probe_us["cold_clean"],
            "rule": f"cold >= {MIN_COLD_OVER_WARM} x warm; dirty >= {MIN_DIRTY_OVER_CLEAN} x clean"}
