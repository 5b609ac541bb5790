"""Where the device activity records of a timed batch come from: one CUPTI session per process.

A sweep times thousands of cases, most of them in tens of milliseconds. Starting and stopping
torch.profiler for every batch costs milliseconds a batch (enter, stop, `_disable_profiler`,
reading the events back), and a second profiled replay per case gave the launch shapes. So the
worker opens CUPTI's activity API once, through NVIDIA's `cupti-python`, and keeps it open: a
batch marks its harness ranges with CUPTI timestamps (the clock the records use), flushes the
activity buffers after synchronizing, and attributes by correlation id exactly as before
(measure/trace.py): a kernel belongs to the range whose API call launched it. Kernel records
carry grid, block, registers and shared memory, so the breakdown needs no replay.

Without `cupti-python` (or where it cannot start) each batch is one torch.profiler (Kineto)
session, as before; rows say which source timed them (`timing.activity_source`). `--trace`
exports need Kineto's trace writer, so a run with `--trace` uses Kineto throughout.

CUPTI's API tracing adds host cost to every CUDA call while it is on. Only the API calls that put
work on the GPU (kernel and graph launches, copies, sets) are recorded: attribution needs the
launch record of each kernel and nothing else, and torch makes many more calls than it launches
(`OPERATORX_CUPTI_API=all` records every call, to compare). Anything that times the host or uses
event pairs (`run --host`, `--timing events`) runs inside `activity_paused()`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Optional, Protocol

from operatorx.measure.trace import (
    Activity,
    CallTrace,
    HostRange,
    LaunchShape,
    TraceBatch,
    attribute,
    attribute_launches,
    run_marked_loop,
)

__all__ = ["ACTIVITY_ENV", "API_ENV", "ActivitySession", "CuptiSession", "KinetoSession", "activity_paused",
           "activity_session", "calls_even", "fallback_reason", "launches_device_work", "open_in_background",
           "records_complete", "use_kineto"]

ACTIVITY_ENV = "OPERATORX_ACTIVITY"
"""`kineto` forces one torch.profiler session per batch; `cupti` requires cupti-python (an error if
missing); unset: cupti-python when it starts, else Kineto."""

API_ENV = "OPERATORX_CUPTI_API"
"""`all` records every runtime and driver API call; unset or `launches`: only those that launch device work."""

_BUFFER_BYTES = 1 << 20
"""Size of each activity buffer CUPTI asks for. CUPTI asks for a fresh buffer at the first record after
a flush, inside the launch that makes it, and that request costs more the larger the buffer, and
more again after the forced flush. Every batch makes one such launch (its GPU wait). 1 MiB holds
~4,000 records: a batch that fills a buffer has it handed back, and decoded in Python, while the
host is still launching, which a smaller size would do to batches of a few hundred calls of a
ten-kernel op."""
_LAUNCH_WORDS = ("Launch", "Memcpy", "Memset")
_NOT_CALLS = ("INVALID", "SIZE", "FORCE_INT")      # the callback-id enums' bounds, not API calls


def records_complete(device: Sequence[tuple[Activity, int]], launch_at: Mapping[int, tuple[int, int]]) -> bool:
    """Whether every launch record has a device record and every device record its launch, by
    correlation id (only launching API calls recorded: CuptiSession.api_filter)."""
    device_ids = {corr for _, corr in device}
    return device_ids == launch_at.keys()


def calls_even(calls: Sequence[CallTrace]) -> bool:
    """Whether every call of a batch holds as many device records as the others (they all ran the
    same op): a call short of the rest lost records to a flush that came too early."""
    return len({len(c.activities) for c in calls}) <= 1


def _attribute(device: list[tuple[Activity, int]], launch_at: dict[int, tuple[int, int]],
               ranges: list[HostRange], t_begin: int) -> tuple[list[CallTrace], int, int, Optional[int]]:
    """(calls, harness count, unattributed count, last device end) of a batch's records: each device
    record goes to the call whose host range its launch lies in; work launched before the batch
    began (an earlier case's tail) is not the batch's."""
    launches = [(act, launch_at.get(corr)) for act, corr in device]
    launches = [(act, api) for act, api in launches if api is None or api[0] >= t_begin]
    mine = [(act, api[0] if api is not None else None) for act, api in launches]
    calls, harness, unattributed = attribute_launches(ranges, mine,
                                                      [api[1] if api is not None else None for _, api in launches])
    return calls, harness, unattributed, max((act.end_ns for act, _ in mine), default=None)


def launches_device_work(cbid_name: str) -> bool:
    """Whether a runtime or driver API (by its CUPTI callback-id name) can put a kernel, copy or set
    on the GPU: its record is the one a device record's correlation id points at. Graph-building
    calls (`...Node...`) do not run anything."""
    name = cbid_name.rsplit("__", 1)[-1]        # '_Runtime_api_trace_cbid__cudaLaunchKernel_v13000'
    return "Node" not in name and any(word in name for word in _LAUNCH_WORDS)


class ActivitySession(Protocol):
    name: str

    def batch(self, call: Callable[[], Any], n: int, flush: Optional[Callable[[], None]], spin_cycles: int,
              pause_s: float = 0.0, pause_spin_cycles: int = 0, released: bool = False) -> TraceBatch: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def discard(self) -> None: ...

    @property
    def on(self) -> bool: ...


class KinetoSession:
    """One torch.profiler session per batch (the source without cupti-python, and for `--trace`)."""

    name = "kineto"

    def batch(self, call: Callable[[], Any], n: int, flush: Optional[Callable[[], None]], spin_cycles: int,
              pause_s: float = 0.0, pause_spin_cycles: int = 0, released: bool = False) -> TraceBatch:
        import torch
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile, record_function

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            enqueue_s = run_marked_loop(record_function, call, n, flush, spin_cycles, pause_s, pause_spin_cycles,
                                        released)
            torch.cuda.synchronize()
        calls, harness, unattributed = attribute(prof.profiler.kineto_results.events(), DeviceType.CPU,
                                                 DeviceType.CUDA)
        return TraceBatch(calls=calls, harness_activities=harness, unattributed=unattributed,
                          enqueue_s_per_call=enqueue_s, profiler=prof, source=self.name)

    def pause(self) -> None:
        """Nothing stays on between batches."""

    def resume(self) -> None:
        """Nothing to turn on: each batch is its own session."""

    def discard(self) -> None:
        """Nothing is buffered between batches."""

    @property
    def on(self) -> bool:
        return False


class _Mark:
    """A harness range in CUPTI's clock: two timestamps around the step."""

    __slots__ = ("_now", "_out", "_name", "_start")

    def __init__(self, now: Callable[[], int], out: list[HostRange], name: str):
        self._now, self._out, self._name = now, out, name
        self._start = 0

    def __enter__(self) -> None:
        self._start = self._now()

    def __exit__(self, *exc: object) -> None:
        self._out.append((self._start, self._now(), self._name))


class CuptiSession:
    """CUPTI's activity API through cupti-python, enabled once and kept on between batches.

    Records are decoded inside CUPTI's buffer callback (the buffer is reused after it returns)
    into plain tuples; a batch keeps only what was launched after it began.
    """

    name = "cupti-python"

    def __init__(self, enable: bool = True) -> None:
        """`enable=False` does only the slow part (the import and CUPTI's own start) and leaves
        recording off until `begin()`: what `open_in_background` runs on its thread."""
        t0 = time.perf_counter()
        from cupti import cupti

        self.startup_s: dict[str, float] = {"import": round(time.perf_counter() - t0, 4)}
        """Seconds of this session's start by step (import, callbacks, enable, filter): a large part of
        a worker's start, split so it can be read."""
        self._cupti = cupti
        self._lock = threading.Lock()
        self._device: list[tuple[Activity, int]] = []       # (activity, correlation id)
        self._launch_at: dict[int, tuple[int, int]] = {}    # correlation id -> API call (start, end)
        self._names: dict[str, str] = {}
        kinds = cupti.ActivityKind
        self._kernel_kind = int(kinds.CONCURRENT_KERNEL)
        self._memset_kind, self._memcpy_kind = int(kinds.MEMSET), int(kinds.MEMCPY)
        self._api_kinds = {int(kinds.RUNTIME), int(kinds.DRIVER)}
        self._device_kinds = {self._kernel_kind, self._memset_kind, self._memcpy_kind}
        self._kinds = [kinds.CONCURRENT_KERNEL, kinds.MEMSET, kinds.MEMCPY, kinds.RUNTIME, kinds.DRIVER]
        self._recording = False
        self._quiet_cbids: Optional[list[tuple[str, int]]] = None
        self.api_filter = os.environ.get(API_ENV, "").strip().lower() != "all"
        """Whether only the launching API calls are recorded (False: every call, or the CUPTI cannot filter)."""
        self.records_dropped = 0
        """Records skipped since the last batch: incomplete (no end time) or not decodable."""
        self.api_ids_refused = 0
        """Non-launching API ids CUPTI would not filter (ids it does not know): still recorded."""
        t0 = time.perf_counter()
        cupti.activity_register_callbacks(self._requested, self._completed)
        self.startup_s["callbacks"] = round(time.perf_counter() - t0, 4)
        self._on = False
        if enable:
            self.begin()

    def begin(self) -> None:
        """Turn recording on for the first time; a CUPTI that fails half-way is turned off again."""
        try:
            self._resume()
        except Exception:
            for kind in self._kinds:        # a half-enabled CUPTI would tax every CUDA call of the fallback
                try:
                    self._cupti.activity_disable(kind)
                except Exception:  # noqa: BLE001 - disabling what never got enabled
                    pass
            raise

    def _requested(self) -> tuple[int, int]:
        return _BUFFER_BYTES, 0

    def _demangled(self, name: str) -> str:
        out = self._names.get(name)
        if out is None:
            import torch

            try:
                out = torch._C._demangle(name)
            except Exception:  # noqa: BLE001 - a name torch cannot demangle is shown as recorded
                out = name
            self._names[name] = out
        return out

    def _completed(self, activities: list[Any]) -> None:
        """Decode a buffer into tuples, only while a batch is recording: between batches (prepare,
        check, warmup) the records are not the batch's, and decoding them would hold the GIL for
        nothing. A record that is incomplete (no end yet) or cannot be decoded is skipped and
        counted: a call that lost a kernel must not pass silently."""
        if not self._recording:
            return
        device: list[tuple[Activity, int]] = []
        launch_at: dict[int, tuple[int, int]] = {}
        dropped = 0
        for a in activities:
            try:
                kind = int(a.kind)
                if kind in self._api_kinds:
                    launch_at[a.correlation_id] = (a.start, a.end)
                    continue
                if kind not in self._device_kinds:
                    continue
                if not 0 < a.start <= a.end:
                    dropped += 1
                    continue
                if kind == self._kernel_kind:
                    shape = LaunchShape((a.grid_x, a.grid_y, a.grid_z), (a.block_x, a.block_y, a.block_z),
                                        a.registers_per_thread, a.static_shared_memory, a.dynamic_shared_memory)
                    act = Activity(self._demangled(a.name), a.start, a.end, a.correlation_id, shape)
                else:
                    act = Activity("Memset (Device)" if kind == self._memset_kind else "Memcpy", a.start, a.end,
                                   a.correlation_id)
                device.append((act, a.correlation_id))
            except Exception:  # noqa: BLE001 - one odd record must not lose the buffer; it is counted
                dropped += 1
        with self._lock:
            self._device.extend(device)
            self._launch_at.update(launch_at)
            self.records_dropped += dropped

    def _take(self, forced: bool) -> tuple[list[tuple[Activity, int]], dict[int, tuple[int, int]], int]:
        """What CUPTI has recorded since the last take. `forced`: CUPTI's forced flush (flag 1), which
        hands back every buffer, records not yet complete included; else the quick one (flag 0), which
        hands back buffers of completed records only and leaves the next launch ~0.2 ms cheaper (see
        `_BUFFER_BYTES`); `_attributed` checks that it missed nothing."""
        self._cupti.activity_flush_all(1 if forced else 0)
        with self._lock:
            device, launch_at, dropped = self._device, self._launch_at, self.records_dropped
            self._device, self._launch_at, self.records_dropped = [], {}, 0
        return device, launch_at, dropped

    def _attributed(self, ranges: list[HostRange], t_begin: int
                    ) -> tuple[list[CallTrace], int, int, int, Optional[int], bool]:
        """A batch's records after its synchronize, attributed to its calls: (calls, harness count,
        unattributed count, records dropped, last device end, whether the forced flush ran).

        The quick flush first (flag 0: the next launch ~0.2 ms cheaper, see `_BUFFER_BYTES`), then the
        forced one, and the attribution again, where the quick one may have left records behind:
        - a launch without a device record, or a device record without its launch (by correlation id);
        - a call with fewer device records than another call of the batch. The calls all run the same
          op, so one short call, most likely the last, lost its tail. This also covers what the first
          check cannot see: a graph replay's kernels share one correlation id, and a launch held back
          together with its kernels leaves no unpaired id.
        After a synchronize the quick flush normally hands back every record, so the forced flush is the
        exception (each one costs the next launch). Where CUPTI records every API call (no
        filter), calls that launch nothing have no device record and the first check cannot hold: the
        forced flush then runs every time. So does it for an op whose kernel count varies between calls."""
        forced = not self.api_filter
        device, launch_at, dropped = self._take(forced=forced)
        result = _attribute(device, launch_at, ranges, t_begin)
        if not forced and not (records_complete(device, launch_at) and calls_even(result[0])):
            forced = True
            more_device, more_launch_at, more_dropped = self._take(forced=True)
            device += more_device
            launch_at.update(more_launch_at)
            dropped += more_dropped
            result = _attribute(device, launch_at, ranges, t_begin)
        calls, harness, unattributed, last_end = result
        return calls, harness, unattributed, dropped, last_end, forced

    def _resume(self) -> None:
        if not self._on:
            t0 = time.perf_counter()
            for kind in self._kinds:
                self._cupti.activity_enable(kind)
            t1 = time.perf_counter()
            if self.api_filter:
                self._filter_api_records()
            self._on = True
            self.startup_s.setdefault("enable", round(t1 - t0, 4))        # the first resume: the session's start
            self.startup_s.setdefault("filter", round(time.perf_counter() - t1, 4))

    def _filter_api_records(self) -> None:
        """Turn off the records of every API call that launches nothing (each one a record to decode,
        and host time inside the timed loop). A CUPTI without per-call control records them all.

        CUPTI refuses some ids it lists (ERROR_INVALID_PARAMETER): a cupti-python newer than the
        driver's CUPTI lists calls (green contexts, device resources) that CUPTI does not know. Those
        are left as they are and the rest filtered; turning the whole filter off for
        them, as before, recorded every call of every sweep (`activity_api_calls: all`)."""
        cupti = self._cupti
        pairs = (("runtime_api_trace_cbid", "activity_enable_runtime_api"),
                 ("driver_api_trace_cbid", "activity_enable_driver_api"))
        if not all(hasattr(cupti, a) and hasattr(cupti, b) for a, b in pairs):
            self.api_filter = False                 # a CUPTI before 12.6 cannot filter: every call is recorded
            return
        first = self._quiet_cbids is None
        if self._quiet_cbids is None:               # ~1,400 names: sorted once per process, not per resume
            self._quiet_cbids = [(fn_name, int(cbid)) for enum_name, fn_name in pairs
                                 for cbid in getattr(cupti, enum_name)
                                 if cbid.name not in _NOT_CALLS and not launches_device_work(cbid.name)]
        accepted: list[tuple[str, int]] = []
        for fn_name, cbid_value in self._quiet_cbids:
            try:
                getattr(cupti, fn_name)(cbid_value, 0)
            except Exception:  # noqa: BLE001 - an id this CUPTI does not know: nothing of it to filter
                continue
            accepted.append((fn_name, cbid_value))
        if first:
            self.api_ids_refused = len(self._quiet_cbids) - len(accepted)
            self._quiet_cbids = accepted            # later resumes ask only for what this CUPTI took
        if not accepted:
            self.api_filter = False

    @property
    def on(self) -> bool:
        return self._on

    def discard(self) -> None:
        """Flush and drop (undecoded) what is buffered: before a measurement's first batch, so the
        warmup's records are not decoded in that batch's flush. Forced: nothing of the warmup may be
        left to arrive inside a batch."""
        self._take(forced=True)

    def resume(self) -> None:
        """Turn CUPTI back on after `pause` (warmup and the enqueue estimate run with it on, as a batch does)."""
        self._resume()

    def pause(self) -> None:
        """Stop recording (host timing and event pairs must not pay CUPTI's per-call cost) and drop
        what is buffered."""
        if self._on:
            import torch

            torch.cuda.synchronize()
            for kind in self._kinds:
                self._cupti.activity_disable(kind)
            self._on = False
            self._take(forced=True)

    def batch(self, call: Callable[[], Any], n: int, flush: Optional[Callable[[], None]], spin_cycles: int,
              pause_s: float = 0.0, pause_spin_cycles: int = 0, released: bool = False) -> TraceBatch:
        import torch

        self._resume()
        torch.cuda.synchronize()
        now = self._cupti.get_timestamp
        ranges: list[HostRange] = []
        self._recording = True
        try:
            t_begin = now()
            enqueue_s = run_marked_loop(lambda name: _Mark(now, ranges, name), call, n, flush, spin_cycles,
                                        pause_s, pause_spin_cycles, released)
            t_host_end = now()
            torch.cuda.synchronize()
            calls, harness, unattributed, dropped, last_end, forced = self._attributed(ranges, t_begin)
        finally:
            self._recording = False
        return TraceBatch(calls=calls, harness_activities=harness, unattributed=unattributed,
                          enqueue_s_per_call=enqueue_s, source=self.name, records_dropped=dropped,
                          queue_left_ns=last_end - t_host_end if last_end is not None else None,
                          forced_flush=forced)


_session: Optional[ActivitySession] = None
_kineto_only = False
_fallback_reason: Optional[str] = None
_opening: Optional[_Opening] = None


class _Opening:
    """A CUPTI session being started on a thread: its outcome (the session, or what it raised)."""

    def __init__(self) -> None:
        self.session: Optional[CuptiSession] = None
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._open, name="operatorx-cupti-start", daemon=True)
        self.thread.start()

    def _open(self) -> None:
        try:
            self.session = CuptiSession(enable=False)
        except Exception as err:  # noqa: BLE001 - handed to activity_session(), which decides
            self.error = err

    def wait(self) -> CuptiSession:
        """The session (recording still off), once the thread is done; what it raised, raised here."""
        t0 = time.perf_counter()
        self.thread.join()
        if self.error is not None:
            raise self.error
        if self.session is None:        # the thread ended by something other than an Exception
            raise RuntimeError("CUPTI's start-up thread ended without a session")
        self.session.startup_s["wait"] = round(time.perf_counter() - t0, 4)
        return self.session


def open_in_background() -> None:
    """Start CUPTI on a thread now, where `activity_session()` would pick cupti-python.

    CUPTI's start (the import and the callback registration) is a large part of a worker's start when
    it comes after torch's import and CUDA's context; begun on a thread before them, it is done before
    it is asked for. Recording stays off until
    `activity_session()` (which waits for the thread): the device calibration in between runs
    unrecorded, as before."""
    global _opening
    if _session is None and _opening is None and not _kineto_only and _wanted_source() != "kineto":
        _opening = _Opening()


_warned_sources: set[str] = set()


def _wanted_source() -> str:
    """`OPERATORX_ACTIVITY` as given: kineto, cupti or '' (a name that is neither warns once and reads '')."""
    wanted = os.environ.get(ACTIVITY_ENV, "").strip().lower()
    if wanted not in ("", "kineto", "cupti"):
        if wanted not in _warned_sources:
            import warnings

            _warned_sources.add(wanted)
            warnings.warn(f"{ACTIVITY_ENV}={wanted!r} is not kineto or cupti; ignored (cupti-python where it "
                          "starts, else Kineto)", stacklevel=3)
        return ""
    return wanted


def use_kineto(reason: str) -> None:
    """Make this process use torch.profiler per batch from now on (e.g. `--trace`, whose export
    is Kineto's). A CUPTI session already open is paused first: two sources cannot share CUPTI."""
    global _session, _kineto_only, _fallback_reason, _opening
    if _opening is not None:            # a start on its thread: let it finish, and never use it
        _opening.thread.join()
        _opening = None
    if _session is not None and not isinstance(_session, KinetoSession):
        _session.pause()
    _kineto_only, _fallback_reason = True, reason
    _session = KinetoSession()


def activity_session() -> ActivitySession:
    """The process's session, opened on first use (CUPTI's own start-up, ~1 s, happens here)."""
    global _session, _fallback_reason, _opening
    if _session is not None:
        return _session
    opening, _opening = _opening, None
    wanted = _wanted_source()
    if wanted == "kineto" or _kineto_only:
        _fallback_reason = _fallback_reason or f"{ACTIVITY_ENV}=kineto"
        _session = KinetoSession()
        return _session
    try:
        if opening is not None:
            cupti_session = opening.wait()
            cupti_session.begin()
            _session = cupti_session
        else:
            _session = CuptiSession()
    except Exception as err:  # noqa: BLE001 - a missing or broken cupti-python: Kineto, and the row says so
        if wanted == "cupti":
            raise RuntimeError(f"{ACTIVITY_ENV}=cupti but cupti-python cannot start: {type(err).__name__}: "
                               f"{err}. Install it with `pip install cupti-python` (the major version of your "
                               "CUDA driver)") from err
        _fallback_reason = (f"cupti-python unavailable ({type(err).__name__}: {str(err).strip()[:120]}); "
                            "`pip install operatorx[cupti]` for sweep speed")
        _session = KinetoSession()
    return _session


def fallback_reason() -> Optional[str]:
    """Why this process records with Kineto, when it does."""
    return _fallback_reason if isinstance(_session, KinetoSession) else None


@contextmanager
def activity_paused() -> Iterator[None]:
    """CUPTI recording off for the block, and back on after it if it was on (no-op when nothing
    is open): the next case's warmup and enqueue estimate run with it on, as its batches will."""
    session = _session
    was_on = session is not None and session.on
    if session is not None:
        session.pause()
    try:
        yield
    finally:
        if session is not None and was_on:
            session.resume()

