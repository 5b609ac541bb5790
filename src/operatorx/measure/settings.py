"""Timing knobs, with the defaults that met the accuracy targets (docs/benchmarks.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal, Optional

from operatorx.measure.l2 import L2_STATES, L2State

__all__ = ["TimingMode", "TIMING_MODES", "TimingSettings"]

_MAX_PAUSE_BASE_S = 0.05

TimingMode = Literal["kernels", "events", "graph"]
TIMING_MODES: tuple[TimingMode, ...] = ("kernels", "events", "graph")


@dataclass(frozen=True, kw_only=True)
class TimingSettings:
    mode: TimingMode = "kernels"
    """kernels: each call's device time is the span of its own kernels in CUPTI's activity records.
    events: a CUDA event pair around each call (the events are timed with it; kept to compare).
    graph: the op captured in a CUDA graph, each replay's kernels timed as in `kernels`."""
    l2_state: L2State = "cold_clean"
    """The L2 state each timed call starts in (measure/l2.py): cold_clean, cold_dirty or warm."""
    flush_bytes: Optional[int] = None
    """Size of the flush buffer; None means twice the device's L2."""
    warmup_calls: int = 5
    """Calls before timing, at least; the wall-clock floors below may add more."""
    warmup_floor_s: float = 0.002
    """Warm up for at least this long (caches, handles, lazy module loads: the first call pays those,
    the floor only adds calls to a µs op). A longer floor costs every case and buys clocks a sweep
    already holds up (the process's first op has its own 1 s floor, and capped attempts are
    retried)."""
    first_warmup_floor_s: float = 1.0
    """The floor for the first op of a process: an idle GPU needs this long to reach its clocks."""
    min_samples: int = 10
    """The median is taken over at least this many timed calls."""
    max_samples: int = 2000
    """Stop after this many timed calls."""
    noise_target: float = 0.005
    """Stop once the 95% confidence half-width of the median, relative to it, is below this."""
    max_time_s: float = 1.0
    """Per-case cap on sampling wall time once `min_samples` are in (stop reason `time_cap`)."""
    timeout_s: float = 30.0
    """Hard limit even below `min_samples` (a seconds-long call); the stop reason says `timeout`."""
    batch_size: int = 32
    """Timed calls enqueued behind one GPU spin (one profiler session in kernels/graph mode)."""
    spin: bool = True
    """Enqueue a GPU wait ahead of each batch so the host can stay ahead: one the host ends after its
    last launch (measure/host_release.py) where the batch must be fully queued, else a spin of a
    sized length (torch.cuda._sleep)."""
    throttle_retries: int = 3
    """Measure again when the GPU was capped (power/thermal reason and SM clock under the fraction)."""
    throttle_pause_s: float = 0.0005
    """Retry k pauses 2^(k-1) times this (or the call's own latency, when longer) between its calls,
    so the GPU can leave the cap."""
    unpaused_retry_below_s: float = 50e-6
    """Retries of a call shorter than this do not pause between calls; their cooldown alone rests the
    GPU. A 5 µs GEMM behind its L2 flush cannot hold the power cap by itself: what caps it is an
    earlier case's cap still in force, which the cooldown lets go; a ms pause after each of its
    hundreds of retry calls would be most of the case's time."""
    rested_call_s: float = 0.001
    """A call at least this long (per its warmup) is timed rested from the first attempt: each call
    is followed by a pause as long as itself, the warmup's calls included. A GEMM this long drives
    the card into its power cap within its first, back-to-back attempt, and rested retries read the
    same: resting from the start skips the capped attempt and its cooldown. 0 turns it off."""
    throttle_cooldown_s: float = 0.05
    """Retry k first rests the GPU 2^(k-1) times this: a cap left by earlier work (a run of prefill
    GEMMs) outlasts the first few tens of ms of the next case whatever the duty cycle."""
    capped_clock_fraction: float = 0.985
    """An attempt is capped when a power/thermal reason is active and the SM clock is below this
    fraction of its maximum."""
    telemetry_period_s: float = 0.005
    """NVML sampling period during the timed window."""

    def __post_init__(self) -> None:
        if self.mode not in TIMING_MODES:
            raise ValueError(f"timing.mode must be one of {', '.join(TIMING_MODES)}, got {self.mode!r}")
        if self.l2_state not in L2_STATES:
            raise ValueError(f"timing.l2_state must be one of {', '.join(L2_STATES)}, got {self.l2_state!r}")
        for name in ("warmup_calls", "min_samples", "max_samples", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"timing.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_samples < self.min_samples:
            raise ValueError(f"timing.max_samples ({self.max_samples}) < min_samples ({self.min_samples})")
        for name in ("warmup_floor_s", "first_warmup_floor_s", "max_time_s", "timeout_s", "throttle_pause_s",
                     "unpaused_retry_below_s", "rested_call_s",
                     "noise_target", "telemetry_period_s", "throttle_retries", "throttle_cooldown_s"):
            if not getattr(self, name) >= 0:        # NaN too: it compares false with everything, so a NaN
                # noise target is never met and a NaN cap never ends sampling
                raise ValueError(f"timing.{name} must be a number >= 0, got {getattr(self, name)}")
        if not 0 < self.capped_clock_fraction <= 1:
            raise ValueError("timing.capped_clock_fraction must be in (0, 1]")

    def pause_s(self, attempt: int, call_s: float = 0.0) -> float:
        """Pause between calls for attempt 0 (none), 1, 2, 3...: none for a call shorter than
        `unpaused_retry_below_s`, else 0.5, 1, 2 ms by default, or 1, 2, 4 times the call itself when
        that is longer (up to 50 ms, doubled: a seconds-long call's retries must still end inside the
        case's deadline). The GPU's average power follows the duty cycle, so a rest much shorter
        than a GEMM that holds the power cap by itself changes nothing. A µs call needs no ms rest
        after each call once the cooldown (`cooldown_s`) has let an earlier cap go: the rests would
        be most of its retry's time."""
        if attempt == 0 or call_s < self.unpaused_retry_below_s:
            return 0.0
        base = max(self.throttle_pause_s, min(call_s, _MAX_PAUSE_BASE_S))
        return base * 2 ** (attempt - 1)

    def max_pause_s(self) -> float:
        """The longest pause any retry makes: `pause_s`'s ceiling at the last retry (50 ms doubled per
        retry: 200 ms with 3)."""
        return _MAX_PAUSE_BASE_S * 2 ** max(0, self.throttle_retries - 1)

    def rested_pause_s(self, call_s: float) -> float:
        """The pause of a first attempt: as long as the call (50 ms at most) for a call of at least
        `rested_call_s`, else none."""
        if self.rested_call_s <= 0 or call_s < self.rested_call_s:
            return 0.0
        return min(call_s, _MAX_PAUSE_BASE_S)

    def cooldown_s(self, attempt: int) -> float:
        """Rest before attempt 0 (none), 1, 2, 3...: 1, 2, 4 times `throttle_cooldown_s`."""
        return 0.0 if attempt == 0 else self.throttle_cooldown_s * 2 ** (attempt - 1)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
