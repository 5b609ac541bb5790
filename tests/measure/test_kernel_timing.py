"""Kernel-level timing on a GPU: spans are the op's own kernels, graphs, refusals."""

from __future__ import annotations

import pytest

from operatorx.measure import NotMeasurable, TimingSettings
from operatorx.measure.device_timer import device_timer

pytestmark = pytest.mark.gpu

FAST = dict(warmup_calls=2, warmup_floor_s=0, first_warmup_floor_s=0, max_time_s=0.5)


def _timer(**kw):
    import torch

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return device_timer(TimingSettings(**{**FAST, **kw}), l2, None)


def test_a_planted_spin_is_timed_by_its_own_kernel_and_matches_events():
    import torch

    spin = lambda: torch.cuda._sleep(100_000)              # noqa: E731 - ~50 µs at ~2 GHz
    kernels = _timer().measure(spin)
    events = _timer(mode="events").measure(spin)
    assert kernels.method == "cupti_kernels" and kernels.summary["n"] >= 10
    assert 20 < kernels.latency_us < 200
    # the event pair is timed with the kernel: events read a little more (seen: +2.8 µs on the H200)
    assert 0 <= events.latency_us - kernels.latency_us < 6
    assert kernels.details.unattributed_activities == 0
    assert kernels.details.flush_launch == "cuda_graph" and kernels.details.l2_state == "cold_clean"


def test_every_kernel_of_a_call_counts_and_the_flush_does_not():
    import torch

    x = torch.randn(4096, 4096, device="cuda")

    def op():
        torch.zeros(1 << 20, device="cuda")                # the op's own fill: same kernel as the flush's
        return x * 2.0

    m = _timer().measure(op)
    from operatorx.measure.kernels import kernel_breakdown

    table = kernel_breakdown(m.last_batch)
    assert table is not None and len(table["kernels"]) == 2 and all(k["count_per_call"] == 1 for k in table["kernels"])
    assert all("discard" not in k["name"] for k in table["kernels"])
    assert all("grid" in k and "block" in k for k in table["kernels"])
    # 64 MiB read + 64 MiB written + 4 MiB zeroed: at <= 5 TB/s this cannot take under ~25 µs
    assert m.latency_us > 25


def test_warm_l2_is_faster_than_cold_for_a_read_that_fits():
    import torch

    x = torch.randn(4 << 20, device="cuda")                # 16 MiB
    cold = _timer().measure(x.sum).latency_us
    warm = _timer(l2_state="warm").measure(x.sum).latency_us
    assert warm < cold / 1.05


def test_graph_mode_times_replays_and_refuses_what_cannot_be_captured():
    import torch

    x = torch.randn(1024, 1024, device="cuda")
    m = _timer(mode="graph").measure(lambda: x @ x)
    assert m.method == "cupti_kernels/cuda_graph" and m.summary["n"] >= 10 and m.latency_us > 0
    with pytest.raises(NotMeasurable, match="CUDA graph"):
        _timer(mode="graph").measure(lambda: (x.sum().item(), x + 1))
    assert torch.randn(4, device="cuda").isfinite().all()     # a failed capture leaves torch usable


def test_an_op_that_waits_on_the_gpu_inside_a_call_is_timed_with_its_gaps_and_says_so():
    import torch

    x = torch.randn(1 << 20, device="cuda")

    def syncing_op():
        n = int(x[0].abs().item() * 0)                     # a device->host wait inside the call
        return x * (2.0 + n)

    m = _timer(max_time_s=0.3).measure(syncing_op)
    assert m.details.host_gaps_included is True and m.summary["n"] >= 10


def test_with_cupti_python_the_records_come_from_one_session_that_stays_open():
    """The real cupti-python package (its record fields, not the CPU fake's): the source is named,
    no record is dropped, launch shapes come from the kernel records, and a second measurement
    reuses the same session."""
    pytest.importorskip("cupti")
    import torch

    from operatorx.measure import activity
    from operatorx.measure.kernels import kernel_breakdown

    a = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    first = _timer().measure(lambda: a @ b)
    session = activity.activity_session()
    second = _timer().measure(lambda: a @ b)
    assert activity.activity_session() is session and isinstance(session, activity.CuptiSession)
    for m in (first, second):
        assert m.details.activity_source == "cupti-python" and m.details.activity_records_dropped == 0
        assert m.details.unattributed_activities == 0
    table = kernel_breakdown(second.last_batch)
    assert table is not None and all(k["grid"][0] >= 1 and k["registers_per_thread"] > 0 for k in table["kernels"])
    assert abs(second.latency_us / first.latency_us - 1) < 0.1
