"""Kernel attribution from Kineto-like events, on the CPU: which device work was whose."""

from __future__ import annotations

from dataclasses import dataclass

from operatorx.measure.kernels import kernel_breakdown
from operatorx.measure.trace import STARVED_GAP_NS, TraceBatch, attribute

CPU, CUDA = "cpu", "cuda"


@dataclass
class Ev:
    _name: str
    _dev: str
    _start: int
    _end: int
    _corr: int = 0
    _linked: int = 0
    _annot: bool = False

    def name(self): return self._name
    def device_type(self): return self._dev
    def start_ns(self): return self._start
    def end_ns(self): return self._end
    def correlation_id(self): return self._corr
    def linked_correlation_id(self): return self._linked
    def is_user_annotation(self): return self._annot


def _fill(start, corr):
    """The same fill kernel name the harness's flush uses: names must not decide ownership."""
    return Ev("vectorized_elementwise_kernel<fill>", CUDA, start, start + 1_000, corr)


def _events(gap_ns=500, inner_gap_ns=0):
    """spin, then 2 x [flush (fill + discard), call (own fill + gemm + splitK reduce)].

    Host op ids and CUPTI correlation ids overlap on purpose (id 11 is both), as in real traces.
    """
    ev = [Ev("ox.spin", CPU, 0, 10, 1, _annot=True), Ev("cudaLaunchKernel", CPU, 5, 6, 5),
          Ev("spin_kernel", CUDA, 100, 50_000, 5)]
    t_gpu = 50_000
    corr = 10
    for i in range(2):
        h = 1_000 + i * 1_000
        ev += [Ev("ox.flush", CPU, h, h + 100, 2 + 10 * i, _annot=True),
               Ev("cudaLaunchKernel", CPU, h + 10, h + 11, corr + 1),
               Ev("cuLaunchKernelEx", CPU, h + 20, h + 21, corr + 2),
               Ev("ox.call", CPU, h + 200, h + 600, 3 + 10 * i, _annot=True),
               Ev("aten::zeros", CPU, h + 205, h + 220, 11 + 10 * i),        # host-op id 11 collides
               Ev("cudaLaunchKernel", CPU, h + 210, h + 211, corr + 3),
               Ev("aten::mm", CPU, h + 300, h + 500, 12 + 10 * i),
               Ev("cuLaunchKernelEx", CPU, h + 310, h + 311, corr + 4),
               Ev("cudaLaunchKernelExC", CPU, h + 320, h + 321, corr + 5)]
        ev += [_fill(t_gpu, corr + 1), Ev("_discard", CUDA, t_gpu + 1_000, t_gpu + 2_000, corr + 2)]
        t = t_gpu + 2_000 + gap_ns
        g = inner_gap_ns
        ev += [_fill(t, corr + 3), Ev("nvjet_splitK", CUDA, t + 1_500 + g, t + 11_500 + g, corr + 4, 12 + 10 * i),
               Ev("splitKreduce", CUDA, t + 11_400 + g, t + 12_000 + g, corr + 5, 12 + 10 * i),
               Ev("ox.call", CUDA, t, t + 12_000 + g, 3 + 10 * i, _annot=True)]   # Kineto's GPU copy: ignored
        t_gpu = t + 12_000 + g
        corr += 10
    return ev


def test_each_call_owns_the_kernels_it_launched_and_nothing_of_the_harness():
    calls, harness, unattributed = attribute(_events(), CPU, CUDA)
    assert len(calls) == 2 and harness == 5 and unattributed == 0
    for c in calls:
        assert [a.name for a in c.activities] == ["vectorized_elementwise_kernel<fill>", "nvjet_splitK", "splitKreduce"]
        assert c.span_ns == 12_000                     # own fill start .. reduce end
        assert c.busy_ns == 1_000 + 10_000 + 500       # the reduce overlaps the gemm by 100 ns
        assert c.gap_before_ns == 500 and not c.starved


def test_a_call_the_host_did_not_feed_in_time_is_starved():
    calls, _, _ = attribute(_events(gap_ns=STARVED_GAP_NS + 1_000), CPU, CUDA)
    assert all(c.starved for c in calls)


def test_a_call_whose_later_kernel_waited_on_the_host_is_starved_too():
    calls, _, _ = attribute(_events(inner_gap_ns=STARVED_GAP_NS + 500), CPU, CUDA)
    assert all(c.starved and c.gap_before_ns == 500 and c.max_gap_ns == STARVED_GAP_NS + 1_000 for c in calls)


def test_a_call_whose_kernel_was_launched_only_just_in_time_is_counted_late_not_dropped():
    """The launch of call 1's GEMM returned on the host 1 µs before its fill ended on the GPU: the GPU
    had nothing queued behind the fill (the host only just ahead). It is counted, not starved: dropping
    such calls cost the H200 sweep up to 1.1 s a block-FP8 case and steadied nothing. Call 0's
    launches were long done."""
    from operatorx.measure.trace import LAUNCH_LEAD_NS, attribute_launches

    calls, _, _ = attribute(_events(), CPU, CUDA)
    assert not any(c.starved for c in calls)
    ev = _events()
    fill_end = [e for e in ev if e._dev == CUDA and e._corr == 23][0]._end      # call 1's own fill
    ev = [Ev(e._name, e._dev, e._start, fill_end - 1_000, e._corr) if e._dev == CPU and e._corr == 24 else e
          for e in ev]
    calls, _, _ = attribute(ev, CPU, CUDA)
    assert calls[0].launched_late == 0 and calls[1].launched_late == 1 and not calls[1].starved
    assert calls[1].max_gap_ns < STARVED_GAP_NS
    assert LAUNCH_LEAD_NS == 5_000 and attribute_launches([], [], None) == ([], 0, 0)


def test_work_launched_outside_the_ranges_is_counted_not_given_to_a_call():
    ev = _events() + [Ev("cudaLaunchKernel", CPU, 900_000, 900_001, 999), Ev("stray", CUDA, 1, 2, 999)]
    calls, _, unattributed = attribute(ev, CPU, CUDA)
    assert unattributed == 1 and all("stray" not in [a.name for a in c.activities] for c in calls)


def test_a_kernel_without_its_launch_record_falls_back_to_the_launching_host_op():
    ev = [e for e in _events() if not (e._name == "cuLaunchKernelEx" and e._corr == 14)]   # call 0's gemm launch
    calls, _, unattributed = attribute(ev, CPU, CUDA)
    assert unattributed == 0 and "nvjet_splitK" in [a.name for a in calls[0].activities]


def test_breakdown_counts_per_call():
    calls, harness, unattributed = attribute(_events(), CPU, CUDA)
    table = kernel_breakdown(TraceBatch(calls, harness, unattributed, 1e-4), launch_shapes=False)
    assert table is not None and table["calls"] == 2 and table["span_us_median"] == 12.0
    by_name = {k["name"]: k for k in table["kernels"]}
    assert by_name["nvjet_splitK"]["count_per_call"] == 1 and by_name["nvjet_splitK"]["device_us_per_call"] == 10.0
    assert "_discard" not in by_name and "spin_kernel" not in by_name


def test_breakdown_of_an_op_that_starves_every_call_is_of_those_calls_and_says_so():
    """The timer keeps such calls (host gaps included); the breakdown must describe them, not vanish."""
    calls, harness, unattributed = attribute(_events(inner_gap_ns=STARVED_GAP_NS + 500), CPU, CUDA)
    table = kernel_breakdown(TraceBatch(calls, harness, unattributed, 1e-4), launch_shapes=False)
    assert table is not None and table["calls"] == 2 and table["host_gaps_included"] is True
    assert {k["name"] for k in table["kernels"]} == {"vectorized_elementwise_kernel<fill>", "nvjet_splitK",
                                                      "splitKreduce"}
    clean = kernel_breakdown(TraceBatch(*attribute(_events(), CPU, CUDA), 1e-4), launch_shapes=False)
    assert clean is not None and "host_gaps_included" not in clean


class _FakeRelease:
    def __init__(self, log: list) -> None:
        self.log = log

    def hold(self, max_cycles: int) -> None:
        self.log.append(("hold", max_cycles))

    def release(self) -> None:
        self.log.append("release")


def _loop_with(monkeypatch, log: list, call, released: bool = True, pause_s: float = 0.0) -> None:
    from contextlib import nullcontext

    import torch

    from operatorx.measure import host_release
    from operatorx.measure.trace import run_marked_loop

    monkeypatch.setattr(host_release, "host_release", lambda: _FakeRelease(log))
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(("sleep", cycles)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    run_marked_loop(lambda name: nullcontext(), call, 2, lambda: log.append("flush"), 5_000, pause_s=pause_s,
                    pause_spin_cycles=0, released=released)


def test_a_released_spin_holds_before_the_first_launch_and_lets_go_after_the_last(monkeypatch):
    log: list = []
    _loop_with(monkeypatch, log, lambda: log.append("call"))
    assert log == [("hold", 5_000), "flush", "call", "flush", "call", "release"]


def test_a_spin_mark_that_raises_still_lets_the_gpu_go(monkeypatch):
    """An error between the hold and the first call (the spin's range mark) releases it too."""
    import pytest

    from operatorx.measure import host_release
    from operatorx.measure.trace import run_marked_loop

    log: list = []
    monkeypatch.setattr(host_release, "host_release", lambda: _FakeRelease(log))

    class BadMark:
        def __enter__(self) -> None: ...

        def __exit__(self, *exc: object) -> None:
            raise RuntimeError("mark failed")

    with pytest.raises(RuntimeError, match="mark failed"):
        run_marked_loop(lambda name: BadMark(), lambda: log.append("call"), 2, None, 5_000, released=True)
    assert log == [("hold", 5_000), "release"]


def test_a_call_that_raises_still_lets_the_gpu_go(monkeypatch):
    import pytest

    log: list = []

    def boom() -> None:
        raise RuntimeError("the op failed")

    with pytest.raises(RuntimeError, match="the op failed"):
        _loop_with(monkeypatch, log, boom)
    assert log == [("hold", 5_000), "flush", "release"]


def test_without_release_or_when_rested_the_spin_is_a_fixed_length(monkeypatch):
    log: list = []
    _loop_with(monkeypatch, log, lambda: log.append("call"), released=False)
    assert log[0] == ("sleep", 5_000) and "release" not in log
    log.clear()
    _loop_with(monkeypatch, log, lambda: log.append("call"), pause_s=1e-6)
    assert log[0] == ("sleep", 5_000) and "release" not in log
