"""The host-released GPU wait on a real GPU: it holds the queue until the host lets go, gives up
after its budget when the host never does, and the timer uses it for untrimmed spins."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.gpu


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


def test_the_gpu_waits_until_the_host_lets_go():
    # a budget of ~1 s at 2 GHz: only the release can end it after ~30 ms
    held = _held_ms(2_000_000_000, 0.030)
    assert 29.0 <= held <= 80.0


def test_a_wait_the_host_never_ends_gives_up_after_its_budget_and_the_next_one_works():
    # 10 M cycles: 5 ms at 2 GHz, up to ~30 ms if the clock sat at an idle ~345 MHz throughout
    held = _held_ms(10_000_000, -1)
    assert 4.0 <= held <= 35.0
    assert 9.5 <= _held_ms(2_000_000_000, 0.010) <= 60.0


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
    assert t["spin_release_unavailable"] is None
    assert t["spin_released_batches"] == t["batches"] >= 1
    assert t["starved_calls_dropped"] <= 2 and m.summary["n"] >= 10
