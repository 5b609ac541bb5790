"""The host-released GPU wait on a real GPU: it holds the queue until the host lets go, gives up
after its budget when the host never does, and the timer uses it for untrimmed spins."""

from __future__ import annotations

import time

import pytest


def _held_ms(hold_cycles: int, host_s: float) -> float:
    """GPU milliseconds between an event before the wait and one after it, the host letting go
    after `host_s` (or not at all when negative)."""
    import torch

    from operatorx.measure.host_release import host_release, unavailable_reason

    waiting = host_release()
    assert waiting is not None, unavailable_reason()
    before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    before.record()
    waiting.hold(hold_cycles)
    after.record()
    if host_s >= 0:
        time.sleep(host_s)
        waiting.release()
    after.synchronize()
    waiting.release()
    return before.elapsed_time(after)


@pytest.mark.gpu
def test_the_gpu_waits_until_the_host_lets_go():
    # a budget of ~1 s at 2 GHz: only the release can end it after ~30 ms
    held = _held_ms(2_000_000_000, 0.030)
    assert 29.0 <= held <= 80.0


@pytest.mark.gpu
def test_a_wait_the_host_never_ends_gives_up_after_its_budget_and_the_next_one_works():
    # 10 M cycles: 5 ms at 2 GHz, up to ~30 ms if the clock sat at an idle ~345 MHz throughout
    held = _held_ms(10_000_000, -1)
    assert 4.0 <= held <= 35.0
    assert 9.5 <= _held_ms(2_000_000_000, 0.010) <= 60.0


@pytest.mark.gpu
def test_a_hold_left_over_by_an_error_is_let_go_by_the_next_one():
    """An error between a hold and its release leaves a wait queued; the next hold lets it go
    before queueing its own, so nothing waits out a budget of ~1 s (2**31 cycles at ~2 GHz)."""
    import torch

    from operatorx.measure.host_release import host_release, unavailable_reason

    waiting = host_release()
    assert waiting is not None, unavailable_reason()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    waiting.hold(2**31 - 1)                 # never released by its caller
    waiting.hold(2**31 - 1)
    waiting.release()
    torch.cuda.synchronize()
    assert time.perf_counter() - t0 < 0.2


@pytest.mark.gpu
def test_no_ticket_or_budget_compiles_the_wait_again():
    """Triton would compile again for an int of 1 or one divisible by 16 if it specialized on them
    (about 250 ms on the H200, inside a case): every hold launches the one compiled kernel."""
    import torch

    from operatorx.measure.host_release import host_release, unavailable_reason

    waiting = host_release()
    assert waiting is not None, unavailable_reason()
    for budget in (1, 16, 17, 4096, 2**20 + 1, 2**31 - 1):
        for _ in range(3):                  # tickets of every kind go by as well
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            waiting.hold(budget)
            launch_s = time.perf_counter() - t0
            waiting.release()
            torch.cuda.synchronize()
            assert launch_s < 0.05, (budget, launch_s)


@pytest.mark.gpu
def test_the_timer_releases_every_batch_of_a_multi_kernel_call():
    import torch

    from operatorx.measure import TimingSettings
    from operatorx.measure.device_timer import device_timer

    x = torch.randn(2048, 2048, device="cuda")

    def op():
        y = x * 2.0
        return y + 1.0

    settings = TimingSettings(warmup_calls=2, warmup_floor_s=0, first_warmup_floor_s=0, max_time_s=0.5)
    m = device_timer(settings, torch.cuda.get_device_properties(0).L2_cache_size, None).measure(op)
    t = m.details
    assert t.spin_release_unavailable is None
    assert t.spin_released_batches == t.batches >= 1
    assert t.starved_calls_dropped <= 2 and m.summary["n"] >= 10


def test_without_a_gpu_it_is_unavailable_says_why_and_is_not_asked_again(monkeypatch):
    """No CUDA here (the CPU machine): no wait is built, the reason is kept for the rows, the timer
    keeps its fixed spin, and the process does not try to build it again for every batch."""
    import torch

    from operatorx.measure import host_release

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    built: list[int] = []

    class Counted(host_release.HostRelease):
        def __init__(self) -> None:
            built.append(1)
            super().__init__()

    monkeypatch.setattr(host_release, "HostRelease", Counted)
    monkeypatch.setattr(host_release, "_instance", None)
    monkeypatch.setattr(host_release, "_unavailable", None)
    assert host_release.host_release() is None
    why = host_release.unavailable_reason()
    assert why is not None and why.startswith("RuntimeError: ") and "pin" in why
    assert host_release.host_release() is None and built == [1]


def test_each_hold_takes_a_new_ticket_and_a_stale_hold_is_let_go_first(monkeypatch):
    """The host's side without a GPU: the kernel launch is recorded, the pinned word is a plain array."""
    import numpy as np

    from operatorx.measure import host_release

    launched: list[tuple[int, int]] = []

    class Launch:
        def __getitem__(self, grid):
            return lambda flag, ticket, budget, num_warps: launched.append((ticket, budget))

    monkeypatch.setattr(host_release, "_wait_kernel", lambda: Launch())
    waiting = object.__new__(host_release.HostRelease)
    waiting._flag, waiting._word, waiting._ticket, waiting._held = None, np.zeros(1, dtype=np.int64), 0, False
    waiting.hold(5_000)
    assert launched == [(1, 5_000)] and waiting._word[0] == 0          # the GPU waits for ticket 1
    waiting.hold(3**40)                                                 # an error skipped the release
    assert waiting._word[0] == 1                                        # ticket 1 let go before ticket 2
    assert launched[-1] == (2, 2**31 - 1)                               # the budget stays an int32
    waiting.release()
    waiting.release()                                                   # a second release changes nothing
    assert waiting._word[0] == 2


def test_on_rocm_it_is_not_tried(monkeypatch):
    """The wait reads NVIDIA's %clock64 through inline PTX: a ROCm build is told so, and nothing is
    compiled (at best a compile error, at worst a fatal one in the worker)."""
    import torch

    from operatorx.measure import host_release

    built: list[int] = []
    monkeypatch.setattr(torch.version, "hip", "6.2.0", raising=False)
    monkeypatch.setattr(host_release, "HostRelease", lambda: built.append(1))
    monkeypatch.setattr(host_release, "_instance", None)
    monkeypatch.setattr(host_release, "_unavailable", None)
    assert host_release.host_release() is None and built == []
    assert host_release.unavailable_reason() == "ROCm: the wait reads NVIDIA's %clock64 (PTX)"


def test_a_hold_whose_launch_raised_is_still_let_go(monkeypatch):
    """A launch that queued the wait and then raised (a Triton launcher error after the enqueue) must
    not leave the GPU waiting out the whole budget: the next release writes the ticket."""
    import numpy as np

    from operatorx.measure import host_release

    def failing_launch(*args, **kwargs):
        raise RuntimeError("launcher failed after the enqueue")

    class FakeKernel:
        def __getitem__(self, grid):
            return failing_launch

    waiting = object.__new__(host_release.HostRelease)
    waiting._word, waiting._ticket, waiting._held = np.zeros(1, dtype=np.int64), 0, False
    waiting._flag = None                    # the pinned tensor; the fake launch never reads it
    monkeypatch.setattr(host_release, "_wait_kernel", lambda: FakeKernel())
    with pytest.raises(RuntimeError):
        waiting.hold(1000)
    waiting.release()
    assert waiting._word[0] == 1 and not waiting._held
