"""A check, at the start of each CUDA run, that the flushes produce the L2 states they claim.

Without hardware counters the L2 is observed through time: a probe kernel reads a buffer
(a quarter of L2) right after that buffer was read once (so it is in L2) and then the
state's flush ran. Warm: the read hits L2. Cold: it comes from HBM, so it is slower. Cold and
dirty: it also has to write back the flush's dirty lines to make room, so it is slower again.
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


def verdicts(probe_us: dict[str, Optional[float]]) -> dict[str, Optional[bool]]:
    """Which states the probe times confirm (pure, so the rule is tested without a GPU).

    A state whose probe could not run (None: e.g. no discard kernel on this platform) is not
    verified (None); the others are judged on what was measured: a dirty flush can still be shown
    to evict against warm without a clean time to compare with.
    """
    warm, clean, dirty = probe_us.get("warm"), probe_us.get("cold_clean"), probe_us.get("cold_dirty")

    def at_least(a: Optional[float], factor: float, b: Optional[float]) -> Optional[bool]:
        return None if a is None or b is None else a >= factor * b

    evicts_clean = at_least(clean, MIN_COLD_OVER_WARM, warm)
    evicts_dirty = at_least(dirty, MIN_COLD_OVER_WARM, warm)
    dirty_costs = at_least(dirty, MIN_DIRTY_OVER_CLEAN, clean)

    def both(a: Optional[bool], b: Optional[bool], b_needed: bool = True) -> Optional[bool]:
        if a is None or (b is None and b_needed):
            return None
        return bool(a and (b if b is not None else True))

    return {"warm": both(evicts_clean, evicts_dirty, b_needed=False) if evicts_clean is not None
            else evicts_dirty,
            "cold_clean": both(evicts_clean, dirty_costs),
            "cold_dirty": both(evicts_dirty, dirty_costs, b_needed=False)}


def _probe(state: str, l2_bytes: int, read: Any, sm_clock_hz: Optional[float]) -> Optional[float]:
    """Median µs of the probe read after [read, this state's flush]; None when no sample came back."""
    flusher = L2Flusher(state, l2_bytes)  # type: ignore[arg-type]
    try:
        def prime_then_flush() -> None:
            read()
            flusher.flush()

        for _ in range(3):
            prime_then_flush()
            read()
        spin = int(2e-3 * (sm_clock_hz or 2.0e9))
        batch = trace_batch(read, _PROBE_CALLS, prime_then_flush, spin)
        spans = [c.span_ns / 1e3 for c in batch.calls if c.activities and not c.starved]
        return float(np.median(spans)) if spans else None
    finally:
        flusher.release()


def check_l2_states(l2_bytes: Optional[int], declared: str, sm_clock_hz: Optional[float]) -> dict[str, Any]:
    """Probe all three states; the result goes into the run's info and each row's `l2_verified`.

    A state that cannot be produced here (its flusher refuses) is probed as None with the reason
    in `probe_errors`; the run still goes on for a declared state that can be.
    """
    import torch

    if not l2_bytes:
        return {"declared": declared, "verified": False, "why": "the device's L2 size is unknown"}
    probe = torch.randn(max(l2_bytes // 4 // 2, 1 << 16), dtype=torch.bfloat16, device="cuda")
    probe_us: dict[str, Optional[float]] = {}
    errors: dict[str, str] = {}
    try:
        for state in L2_STATES:
            try:
                probe_us[state] = _probe(state, l2_bytes, probe.sum, sm_clock_hz)
            except Exception as err:  # noqa: BLE001 - that state is unverified, and why is kept
                probe_us[state] = None
                errors[state] = f"{type(err).__name__}: {str(err).strip()[:200]}"
    finally:
        del probe
        torch.cuda.empty_cache()
    ok = verdicts(probe_us)
    out: dict[str, Any] = {"declared": declared, "verified": bool(ok.get(declared)), "states_verified": ok,
                           "probe_us": probe_us, "probe_bytes": int(l2_bytes // 4),
                           "rule": f"cold >= {MIN_COLD_OVER_WARM} x warm; dirty >= {MIN_DIRTY_OVER_CLEAN} x clean"}
    if errors:
        out["probe_errors"] = errors
    warm, clean, dirty = probe_us.get("warm"), probe_us.get("cold_clean"), probe_us.get("cold_dirty")
    if warm and clean:
        out["cold_over_warm"] = clean / warm
    if clean and dirty:
        out["dirty_over_clean"] = dirty / clean
    return out
