"""The start-up clock ramp: the process counts as warmed only when NVML shows the clock up (CPU, fakes)."""

from __future__ import annotations

import pytest

import operatorx.measure.loop as loop
from operatorx.measure.clock_ramp import ClockRamp, start_clock_ramp


class _Reading:
    available = True

    def __init__(self, clock_mhz: float) -> None:
        self.clock_mhz = clock_mhz

    def sample(self) -> dict:
        return {"sm_clock_mhz": self.clock_mhz, "max_sm_clock_mhz": 1980}


@pytest.fixture
def no_cuda(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(loop, "_process_warmed", False)


@pytest.mark.parametrize(("clock_mhz", "warmed"), [(1980, True), (1965, True), (1410, False)])
def test_the_first_op_keeps_its_long_floor_unless_the_clock_reads_up(no_cuda, clock_mhz, warmed):
    info = ClockRamp(launched_s=0.0, seconds=1.0).finish(_Reading(clock_mhz), 0.985)
    assert info["warmed"] is warmed and info["sm_clock_mhz"] == clock_mhz
    assert loop._process_warmed is warmed


def test_no_reading_no_warmed_process(no_cuda):
    class Blind:
        available = False

    assert ClockRamp(0.0, 1.0).finish(Blind(), 0.985)["warmed"] is False and loop._process_warmed is False


def test_nothing_to_ramp_without_a_floor_or_a_clock():
    assert start_clock_ramp(0.0, 1.98e9) is None and start_clock_ramp(1.0, None) is None


def test_the_spin_is_queued_in_short_kernels_of_the_whole_length(monkeypatch):
    import torch

    spun: list[int] = []
    monkeypatch.setattr(torch.cuda, "_sleep", spun.append)
    ramp = start_clock_ramp(1.0, 2e9)
    assert ramp is not None and len(spun) == 20 and sum(spun) == pytest.approx(2e9, rel=1e-6)
