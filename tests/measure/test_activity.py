"""The CUPTI session's wiring on the CPU: a scripted `cupti` module stands in for CUPTI.

What is pinned: records are decoded inside the buffer callback, a kernel goes to the call whose
range its launch API record lies in (by correlation id, never by name), work launched before
the batch is not the batch's, launch shapes come from the kernel records, and pausing turns
recording off. The GPU tests (test_kernel_timing.py) show the real CUPTI against real kernels.
"""

from __future__ import annotations

import enum
import sys
import types
from dataclasses import dataclass

import pytest

from operatorx.measure import activity
from operatorx.measure.kernels import kernel_breakdown
from operatorx.measure.trace import CallTrace


class Kind(enum.IntEnum):
    CONCURRENT_KERNEL = 1
    MEMSET = 2
    MEMCPY = 3
    RUNTIME = 4
    DRIVER = 5


@dataclass
class Api:
    correlation_id: int
    start: int
    kind: int = Kind.RUNTIME

    @property
    def end(self) -> int:
        return self.start + 5


@dataclass
class Kernel:
    name: str
    correlation_id: int
    start: int
    end: int
    kind: int = Kind.CONCURRENT_KERNEL
    grid_x: int = 132
    grid_y: int = 1
    grid_z: int = 1
    block_x: int = 128
    block_y: int = 1
    block_z: int = 1
    registers_per_thread: int = 168
    static_shared_memory: int = 0
    dynamic_shared_memory: int = 200_000


class RuntimeCbid(enum.IntEnum):
    INVALID = 0
    cudaGetDevice_v3020 = 1
    cudaLaunchKernel_v7000 = 2
    cudaGraphAddMemcpyNode_v10000 = 3
    _Runtime_api_trace_cbid__cudaLaunchKernel_v13000 = 4
    SIZE = 5


class DriverCbid(enum.IntEnum):
    INVALID = 0
    cuCtxGetCurrent = 1
    cuLaunchKernelEx = 2
    cuMemsetD8Async = 3
    SIZE = 4


class FakeCupti:
    """A host clock that ticks 10 ns per read, and a GPU that runs each launch 1 µs after the last."""

    ActivityKind = Kind
    runtime_api_trace_cbid = RuntimeCbid
    driver_api_trace_cbid = DriverCbid

    def __init__(self) -> None:
        self.api_off: set[tuple[str, int]] = set()
        self.t = 1_000
        self.corr = 0
        self.gpu_t = 1_000_000
        self.pending: list[object] = []
        self.enabled: set[int] = set()
        self.callbacks = None
        self.flags: list[int] = []
        self.held: list[object] = []        # records a quick flush (flag 0) does not hand back yet

    def get_timestamp(self) -> int:
        self.t += 10
        return self.t

    def activity_register_callbacks(self, requested, completed) -> None:
        self.callbacks = (requested, completed)

    def activity_enable(self, kind) -> None:
        self.enabled.add(int(kind))

    def activity_enable_runtime_api(self, cbid: int, enable: int) -> None:
        assert 0 < cbid < RuntimeCbid.SIZE, cbid            # the enum's bounds are not calls
        self.api_off.add(("runtime", cbid)) if not enable else self.api_off.discard(("runtime", cbid))

    def activity_enable_driver_api(self, cbid: int, enable: int) -> None:
        assert 0 < cbid < DriverCbid.SIZE, cbid
        self.api_off.add(("driver", cbid)) if not enable else self.api_off.discard(("driver", cbid))

    def activity_disable(self, kind) -> None:
        self.enabled.discard(int(kind))

    def activity_flush_all(self, flag: int) -> None:
        self.flags.append(flag)
        out, self.pending = self.pending, []
        if flag:
            out, self.held = out + self.held, []
        assert self.callbacks is not None
        self.callbacks[1](out)

    def launch(self, name: str, duration_ns: int) -> None:
        """What a CUDA launch leaves behind while recording is on: an API record and a kernel record."""
        if Kind.RUNTIME not in self.enabled:
            return
        self.corr += 1
        self.pending.append(Api(self.corr, self.get_timestamp()))
        self.pending.append(Kernel(name, self.corr, self.gpu_t, self.gpu_t + duration_ns))
        self.gpu_t += duration_ns + 1_000


@pytest.fixture
def fake(monkeypatch):
    import torch

    cupti = FakeCupti()
    monkeypatch.setitem(sys.modules, "cupti", types.SimpleNamespace(cupti=cupti))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch._C, "_demangle", lambda name: name.replace("_Z4gemm", "gemm()"))
    for name, value in (("_session", None), ("_kineto_only", False), ("_fallback_reason", None), ("_opening", None),
                        ("_warned_sources", set())):
        monkeypatch.setattr(activity, name, value)      # restored after the test: the process's session
    monkeypatch.delenv(activity.ACTIVITY_ENV, raising=False)
    return cupti


def test_each_call_owns_what_it_launched_and_earlier_work_is_not_the_batch(fake):
    session = activity.activity_session()
    assert isinstance(session, activity.CuptiSession) and fake.enabled == {int(k) for k in Kind}
    fake.launch("warmup_kernel", 5_000)                   # before the batch: buffered, not the batch's

    def flush() -> None:
        fake.launch("fill", 2_000)                        # the same name as the op's own fill below

    def call() -> None:
        fake.launch("fill", 1_000)
        fake.launch("_Z4gemm", 10_000)

    batch = session.batch(call, 3, flush, spin_cycles=0)
    assert batch.source == "cupti-python" and batch.harness_activities == 3 and batch.unattributed == 0
    assert len(batch.calls) == 3
    for c in batch.calls:
        assert [a.name for a in c.activities] == ["fill", "gemm()"]
        assert c.span_ns == 1_000 + 1_000 + 10_000 and c.busy_ns == 11_000 and c.gap_before_ns == 1_000
    table = kernel_breakdown(batch)
    assert table is not None
    gemm = {k["name"]: k for k in table["kernels"]}["gemm()"]
    assert gemm["grid"] == [132, 1, 1] and gemm["registers_per_thread"] == 168
    assert gemm["shared_memory_bytes"] == 200_000 and gemm["device_us_per_call"] == 10.0


def test_the_session_is_opened_once_and_a_pause_ends_with_recording_back_on(fake):
    first = activity.activity_session()
    assert activity.activity_session() is first
    start = first.startup_s                               # the session's start, by step, for the worker's laps
    assert list(start) == ["import", "callbacks", "enable", "filter"] and all(v >= 0 for v in start.values())
    with activity.activity_paused():
        assert fake.enabled == set()
        fake.launch("while_paused", 1_000)                # not recorded at all
    assert fake.enabled == {int(k) for k in Kind}         # the next case's warmup runs traced, as its batches
    batch = first.batch(lambda: fake.launch("k", 1_000), 2, None, spin_cycles=0)
    assert [len(c.activities) for c in batch.calls] == [1, 1] and batch.unattributed == 0


def test_a_session_started_on_a_thread_records_only_once_asked_for(fake):
    activity.open_in_background()
    opening = activity._opening
    assert opening is not None
    opening.thread.join(5)
    assert opening.session is not None and fake.callbacks is not None      # CUPTI started on the thread
    assert fake.enabled == set()            # and recording still off: the calibration runs unrecorded
    session = activity.activity_session()
    assert session is opening.session and activity._opening is None
    assert fake.enabled == {int(k) for k in Kind}
    assert list(session.startup_s) == ["import", "callbacks", "wait", "enable", "filter"]
    batch = session.batch(lambda: fake.launch("k", 1_000), 2, None, spin_cycles=0)
    assert [len(c.activities) for c in batch.calls] == [1, 1]


def test_a_thread_that_could_not_start_cupti_leaves_kineto_and_the_reason(fake, monkeypatch):
    def broken(*args):
        raise OSError("libcupti.so.13: cannot open shared object file")

    monkeypatch.setattr(fake, "activity_register_callbacks", broken)
    activity.open_in_background()
    session = activity.activity_session()
    assert isinstance(session, activity.KinetoSession)
    reason = activity.fallback_reason()
    assert reason is not None and "OSError: libcupti.so.13: cannot open" in reason


def test_an_unknown_source_name_warns_once_for_the_thread_and_the_session(fake, monkeypatch):
    import warnings

    monkeypatch.setenv(activity.ACTIVITY_ENV, "nsys")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        activity.open_in_background()
        assert isinstance(activity.activity_session(), activity.CuptiSession)
    assert [str(w.message).split(";")[0] for w in seen] == ["OPERATORX_ACTIVITY='nsys' is not kineto or cupti"]


def test_kineto_asked_for_while_cupti_starts_on_its_thread_waits_and_never_uses_it(fake):
    activity.open_in_background()
    opening = activity._opening
    assert opening is not None
    activity.use_kineto("--trace")
    assert not opening.thread.is_alive() and activity._opening is None
    assert isinstance(activity.activity_session(), activity.KinetoSession)
    assert fake.enabled == set()                          # the thread's session never recorded


def test_no_thread_is_started_where_kineto_is_asked_for(fake, monkeypatch):
    monkeypatch.setenv(activity.ACTIVITY_ENV, "kineto")
    activity.open_in_background()
    assert activity._opening is None and fake.callbacks is None
    activity.use_kineto("--trace")
    monkeypatch.delenv(activity.ACTIVITY_ENV)
    activity.open_in_background()
    assert activity._opening is None


def test_an_incomplete_or_odd_record_is_skipped_and_counted_not_timed(fake):
    session = activity.activity_session()
    calls = iter(range(3))

    def call() -> None:
        fake.launch("k", 1_000)
        if next(calls) == 1:                               # this call's second kernel has no end yet
            fake.corr += 1
            fake.pending += [Api(fake.corr, fake.get_timestamp()), Kernel("late", fake.corr, fake.gpu_t, 0)]
            fake.pending.append(object())                  # and one record nothing can decode

    batch = session.batch(call, 3, None, spin_cycles=0)
    assert batch.records_dropped == 2
    assert [[a.name for a in c.activities] for c in batch.calls] == [["k"], ["k"], ["k"]]


def test_a_batch_takes_its_records_with_the_quick_flush_when_nothing_is_missing(fake):
    session = activity.activity_session()
    session.discard()                                      # a measurement's start: the forced flush
    fake.flags.clear()
    batch = session.batch(lambda: fake.launch("k", 1_000), 3, None, spin_cycles=0)
    assert fake.flags == [0] and not batch.forced_flush
    assert [[a.name for a in c.activities] for c in batch.calls] == [["k"]] * 3


def test_a_kernel_record_the_quick_flush_left_behind_is_fetched_by_the_forced_one(fake):
    session = activity.activity_session()
    calls = iter(range(3))

    def call() -> None:
        fake.launch("a", 1_000)
        fake.launch("b", 2_000)
        if next(calls) == 1:                               # this call's second kernel record is late
            fake.held.append(fake.pending.pop())

    batch = session.batch(call, 3, None, spin_cycles=0)
    assert fake.flags[-2:] == [0, 1] and batch.forced_flush
    assert [[a.name for a in c.activities] for c in batch.calls] == [["a", "b"]] * 3
    assert [c.span_ns for c in batch.calls] == [4_000] * 3


def test_a_launch_record_left_behind_also_forces_the_flush(fake):
    session = activity.activity_session()

    def call() -> None:
        fake.launch("a", 1_000)
        fake.held.append(fake.pending.pop(-2))             # the launch's API record is late

    batch = session.batch(call, 1, None, spin_cycles=0)
    assert batch.forced_flush and batch.unattributed == 0
    assert [[a.name for a in c.activities] for c in batch.calls] == [["a"]]


def test_a_graph_replay_that_came_back_short_is_fetched_by_the_forced_flush(fake):
    """A graph replay's kernels share its launch's correlation id, so a held-back kernel leaves
    no unpaired id: the call's count, short of the others', shows it."""
    session = activity.activity_session()
    calls = iter(range(3))

    def replay() -> None:
        fake.launch("g1", 1_000)
        corr = fake.corr
        for name in ("g2", "g3"):
            fake.pending.append(Kernel(name, corr, fake.gpu_t, fake.gpu_t + 1_000))
            fake.gpu_t += 2_000
        if next(calls) == 2:                               # the last replay's last kernel record is late
            fake.held.append(fake.pending.pop())

    batch = session.batch(replay, 3, None, spin_cycles=0)
    assert batch.forced_flush and fake.flags[-2:] == [0, 1]
    assert [[a.name for a in c.activities] for c in batch.calls] == [["g1", "g2", "g3"]] * 3


def test_a_launch_held_back_with_its_kernel_is_fetched_by_the_forced_flush(fake):
    session = activity.activity_session()
    calls = iter(range(3))

    def call() -> None:
        fake.launch("a", 1_000)
        if next(calls) == 2:                               # the last call's records, both of them, are late
            fake.held += fake.pending[-2:]
            del fake.pending[-2:]

    batch = session.batch(call, 3, None, spin_cycles=0)
    assert batch.forced_flush
    assert [[a.name for a in c.activities] for c in batch.calls] == [["a"]] * 3


def test_discard_and_pause_flush_forced(fake):
    session = activity.activity_session()
    fake.flags.clear()
    session.discard()
    session.pause()
    assert fake.flags == [1, 1]


def test_without_the_api_filter_every_batch_flushes_forced(fake, monkeypatch):
    monkeypatch.setenv(activity.API_ENV, "all")
    session = activity.activity_session()
    fake.flags.clear()
    batch = session.batch(lambda: fake.launch("k", 1_000), 2, None, spin_cycles=0)
    assert fake.flags == [1] and batch.forced_flush


def test_calls_even_means_every_call_has_as_many_device_records():
    act = activity.Activity("k", 0, 1, 7)
    assert activity.calls_even([CallTrace([act, act]), CallTrace([act, act])])
    assert not activity.calls_even([CallTrace([act, act]), CallTrace([act])])
    assert activity.calls_even([]) and activity.calls_even([CallTrace()])


def test_records_complete_pairs_launches_and_device_records_by_correlation_id():
    act = activity.Activity("k", 0, 1, 7)
    assert activity.records_complete([(act, 7)], {7: (0, 1)})
    assert not activity.records_complete([(act, 7)], {7: (0, 1), 8: (2, 3)})
    assert not activity.records_complete([(act, 7), (act, 9)], {7: (0, 1)})
    assert activity.records_complete([], {})


def test_records_outside_a_batch_are_not_decoded(fake):
    session = activity.activity_session()
    assert isinstance(session, activity.CuptiSession)
    decoded: list[str] = []
    original = session._demangled
    session._demangled = lambda name: decoded.append(name) or original(name)   # type: ignore[method-assign]
    fake.launch("warmup_kernel", 1_000)
    session.discard()                                      # a measurement's start: flushed, not decoded
    session.batch(lambda: fake.launch("k", 1_000), 1, None, spin_cycles=0)
    assert decoded == ["k"]


def test_an_unknown_source_name_warns_and_the_default_is_used(fake, monkeypatch):
    monkeypatch.setenv(activity.ACTIVITY_ENV, "nsys")
    with pytest.warns(UserWarning, match="OPERATORX_ACTIVITY='nsys' is not kineto or cupti; ignored"):
        session = activity.activity_session()
    assert isinstance(session, activity.CuptiSession)


@pytest.fixture
def fresh(monkeypatch):
    """The process's session state, restored after the test."""
    for name, value in (("_session", None), ("_kineto_only", False), ("_fallback_reason", None), ("_opening", None),
                        ("_warned_sources", set())):
        monkeypatch.setattr(activity, name, value)
    monkeypatch.delenv(activity.ACTIVITY_ENV, raising=False)


def test_without_cupti_python_each_batch_is_a_kineto_session_and_the_reason_is_kept(monkeypatch, fresh):
    monkeypatch.setitem(sys.modules, "cupti", None)       # import fails as when the package is missing
    session = activity.activity_session()
    assert isinstance(session, activity.KinetoSession)
    reason = activity.fallback_reason()
    assert reason is not None and "cupti-python unavailable" in reason and "operatorx[cupti]" in reason


def test_asking_for_cupti_without_it_is_one_clear_error(monkeypatch, fresh):
    monkeypatch.setitem(sys.modules, "cupti", None)
    monkeypatch.setenv(activity.ACTIVITY_ENV, "cupti")
    with pytest.raises(RuntimeError, match=r"OPERATORX_ACTIVITY=cupti but cupti-python cannot start.*pip install"):
        activity.activity_session()


def test_trace_runs_switch_to_kineto_and_pause_the_open_cupti_session(fake):
    activity.activity_session()
    activity.use_kineto("--trace")
    assert fake.enabled == set() and isinstance(activity.activity_session(), activity.KinetoSession)
    assert activity.fallback_reason() == "--trace"


def test_only_api_calls_that_launch_device_work_are_recorded(fake):
    """Attribution needs each kernel's launch record and nothing else; the other calls (torch makes
    many) would each be a record to decode and host time inside the timed loop."""
    session = activity.activity_session()
    assert isinstance(session, activity.CuptiSession) and session.api_filter
    assert fake.api_off == {("runtime", RuntimeCbid.cudaGetDevice_v3020),
                            ("runtime", RuntimeCbid.cudaGraphAddMemcpyNode_v10000),
                            ("driver", DriverCbid.cuCtxGetCurrent)}


def test_every_api_call_is_recorded_when_asked_or_when_cupti_cannot_filter(fake, monkeypatch):
    monkeypatch.setenv(activity.API_ENV, "all")
    session = activity.activity_session()
    assert isinstance(session, activity.CuptiSession) and not session.api_filter and fake.api_off == set()
    monkeypatch.delenv(activity.API_ENV)
    monkeypatch.setattr(activity, "_session", None)
    monkeypatch.delattr(FakeCupti, "activity_enable_driver_api")        # a CUPTI before 12.6
    session = activity.activity_session()
    assert isinstance(session, activity.CuptiSession) and not session.api_filter


@pytest.mark.parametrize("name, launches", [
    ("cudaLaunchKernel_v7000", True), ("_Runtime_api_trace_cbid__cudaLaunchKernel_v13000", True),
    ("cudaGraphLaunch_v10000", True), ("cuLaunchKernelEx", True), ("cuMemcpyDtoDAsync_v2", True),
    ("cudaMemsetAsync_v3020", True), ("cudaGraphAddMemsetNode_v10000", False),
    ("cudaStreamIsCapturing_v10000", False), ("cuCtxGetCurrent", False)])
def test_which_calls_launch_device_work(name, launches):
    assert activity.launches_device_work(name) is launches


def test_the_quiet_calls_are_listed_once_and_ids_cupti_refuses_are_left_recorded(fake, monkeypatch):
    """cupti-python 13.2 lists 60 CUDA 13.1 calls the H200's driver CUPTI refuses
    (ERROR_INVALID_PARAMETER): the rest stay filtered, not every call recorded again."""
    session = activity.activity_session()
    assert isinstance(session, activity.CuptiSession) and session.api_filter
    assert session.api_ids_refused == 0
    listed = session._quiet_cbids
    session.pause()
    session.resume()
    assert session._quiet_cbids == listed and len(fake.api_off) == 3
    monkeypatch.setattr(activity, "_session", None)
    fake.api_off.clear()

    def refuses_the_driver(cbid: int, enable: int) -> None:
        raise RuntimeError("CUPTI_ERROR_INVALID_PARAMETER")

    monkeypatch.setattr(fake, "activity_enable_driver_api", refuses_the_driver)
    session = activity.activity_session()
    assert isinstance(session, activity.CuptiSession) and session.api_filter and session.api_ids_refused == 1
    assert fake.api_off == {("runtime", RuntimeCbid.cudaGetDevice_v3020),
                            ("runtime", RuntimeCbid.cudaGraphAddMemcpyNode_v10000)}
    assert session._quiet_cbids is not None and len(session._quiet_cbids) == 2     # a resume asks only for these
    monkeypatch.setattr(activity, "_session", None)
    monkeypatch.setattr(fake, "activity_enable_runtime_api", refuses_the_driver)
    session = activity.activity_session()
    assert isinstance(session, activity.CuptiSession) and not session.api_filter   # nothing filtered: said so
