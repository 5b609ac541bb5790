"""run/host.py: host_bound only where the batches agree on it; an unstable host time says why."""

from __future__ import annotations

from operatorx.run.host import host_bound, unstable_why


def test_decided_only_outside_the_middle_half():
    batches = [40.0, 41.0, 42.0, 43.0, 44.0, 45.0, 46.0, 47.0]     # middle half 41.75-45.25
    assert host_bound(batches, 30.0, gpu_paced=False) == (True, None)
    assert host_bound(batches, 50.0, gpu_paced=False) == (False, None)
    bound, why = host_bound(batches, 43.0, gpu_paced=False)
    assert bound is None
    assert why == ("the device time (43.00 µs) lies inside the batches' middle half (41.75-45.25 µs per call): "
                   "the host and the GPU take about as long")


def test_a_gpu_that_paced_the_host_is_never_host_bound():
    # 8192^3 under the power cap: the batches follow the GPU (1.55 ms) above the device time timed earlier
    assert host_bound([1540.0, 1550.0, 1600.0, 1720.0], 1381.0, gpu_paced=True) == (False, None)


def test_unstable_why_names_the_cause():
    assert "lost the CPU" in unstable_why(False, True, 21.0)
    assert unstable_why(True, False, 24.04).startswith("batch IQR 24.0% of the median: the GPU paced the host")
    assert "about as long" in unstable_why(False, False, 8.0)
    # seen on the H200: 1x7168x2048 host 17.0 µs, device 9.5 µs, batch IQR 7.6%: bound, cause unknown
    assert "a cause not identified" in unstable_why(False, False, 7.6, decided=True)
