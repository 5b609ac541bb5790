"""The launch-gap probe: offsets between consecutive kernels, the trimmed mean, and a real reading."""

from __future__ import annotations

import pytest

from operatorx.measure.launch_gap import chain_offsets_ns, trimmed_mean


def test_offsets_are_start_minus_previous_end_inside_each_call_only():
    calls = [[(100, 200), (1_150, 1_300), (2_260, 2_400)],     # gaps 950 and 960
             [(5_000, 5_500), (5_400, 5_600)]]                  # overlapped: -100
    assert chain_offsets_ns(calls) == [950, 960, -100]          # never across the two calls (4,600 ns apart)


def test_offsets_sort_each_call_by_start_first():
    assert chain_offsets_ns([[(2_000, 2_100), (0, 1_000)]]) == [1_000]


def test_trimmed_mean_leaves_out_a_tenth_at_each_end():
    values = [1_000] * 8 + [900, 40_000]       # one boundary the host was late for, one fast reading
    assert trimmed_mean(values) == 1_000
    assert trimmed_mean([960, 992, 1_024]) == pytest.approx(992)    # too few to trim: the plain mean
    with pytest.raises(ValueError):
        trimmed_mean([])


def test_a_mean_of_32_ns_steps_resolves_between_them():
    # readings come in 32 ns steps on the H200: a level of ~1.10 µs reads as 1,088 and 1,120 ns
    values = [1_088] * 60 + [1_120] * 40                   # ten of each end left out: 50 and 30 remain
    assert trimmed_mean(values) == 1_100


@pytest.mark.gpu
def test_the_probe_reads_a_gap_of_about_a_microsecond_between_one_element_adds():
    from operatorx.measure.kernel_timing import warm_activity_session
    from operatorx.measure.launch_gap import measure_launch_gap
    from operatorx.measure.telemetry import Telemetry

    warm_activity_session()
    clock = Telemetry.for_torch_device(0).max_sm_clock_hz() or 2e9
    gap = measure_launch_gap(clock)
    assert gap is not None
    assert gap.boundaries == 8 * 15                 # every boundary of the 8 calls of 16 kernels was recorded
    assert 0.3 < gap.gap_us < 3.0                   # H200: 0.93-1.15 µs (benchmarks §21)
    assert 0.3 < gap.kernel_us < 3.0                # a one-element add: ~0.9 µs
    again = measure_launch_gap(clock)
    assert again is not None and abs(again.gap_us - gap.gap_us) < 0.1     # one level for the process
