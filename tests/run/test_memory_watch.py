"""A case that keeps device memory is a leak, unless it is the first of its op type in the worker to keep
some, within the first-use limit: a kernel path's one-time state (fake readings; no GPU needed)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from operatorx.run import memory_watch
from operatorx.run.memory_watch import MemoryReading, MemoryWatch

_MIB = 1 << 20


@pytest.fixture
def device_mib(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """The device MiB each reading returns, set by the test before each case (readings repeat the last)."""
    held = [100.0]
    monkeypatch.setattr(memory_watch, "read_memory", lambda kind, thorough=False: MemoryReading(
        host_rss_bytes=1000 * _MIB, device_allocated_bytes=int(held[0] * _MIB)))
    yield held


def _case(watch: MemoryWatch, held: list[float], keeps_mib: float, op_type: str):
    held[0] += keeps_mib
    delta = watch.after_case(op_type)
    return delta.first_use, delta.leak(watch.device_limit_mib, watch.host_limit_mib)


def test_the_first_case_of_an_op_type_to_keep_memory_is_first_use_and_the_second_a_leak(device_mib):
    watch = MemoryWatch("cuda", 256, 2048, first_use_limit_device_mib=1024)
    assert _case(watch, device_mib, 8, "dsv4_attn") == (False, None)            # under the limit: nothing to say
    assert _case(watch, device_mib, 264, "dsv4_attn") == (True, None)           # its first: one-time state
    first_use, leak = _case(watch, device_mib, 300, "dsv4_attn")                # again: a leak
    assert not first_use and leak is not None and leak.startswith("memory leak: the case left 300 MiB of device")
    assert _case(watch, device_mib, 300, "mla") == (True, None)                 # another op type has its own first
    assert watch.first_use_taken == {"dsv4_attn", "mla"}


def test_more_than_the_first_use_limit_is_a_leak_even_the_first_time(device_mib):
    watch = MemoryWatch("cuda", 256, 2048, first_use_limit_device_mib=1024)
    first_use, leak = _case(watch, device_mib, 1025, "gemm")
    assert not first_use and leak is not None and "1025 MiB of device memory" in leak
    assert _case(watch, device_mib, 1000, "gemm") == (True, None)       # the one above did not take gemm's first


def test_without_a_first_use_limit_every_growth_past_the_limit_is_a_leak(device_mib):
    watch = MemoryWatch("cuda", 256, 2048)                              # the default: none admitted
    first_use, leak = _case(watch, device_mib, 257, "gqa")
    assert not first_use and leak is not None


def test_first_use_admits_device_memory_only(monkeypatch):
    """Host growth past its limit is a leak whatever the device did."""
    readings = iter([MemoryReading(1000 * _MIB, 100 * _MIB), MemoryReading(4000 * _MIB, 400 * _MIB),
                     MemoryReading(4000 * _MIB, 400 * _MIB)])
    monkeypatch.setattr(memory_watch, "read_memory", lambda kind, thorough=False: next(readings))
    delta = MemoryWatch("cuda", 256, 2048, first_use_limit_device_mib=1024).after_case("moe")
    leak = delta.leak(256, 2048)
    assert delta.first_use and leak is not None
    assert "3000 MiB of host memory" in leak and "device" not in leak
    assert delta.to_json()["first_use"] is True


def test_a_run_s_watch_takes_the_run_s_device_and_limits(device_mib: list[float]) -> None:
    from operatorx.run import RunConfig

    config = RunConfig(testlist="gemm", device="cuda", leak_limit_device_mib=64, leak_limit_host_mib=512,
                       first_use_limit_device_mib=300)
    watch = MemoryWatch.for_run(config)
    assert (watch.device_kind, watch.device_limit_mib, watch.host_limit_mib, watch.first_use_limit_device_mib) == \
        ("cuda", 64, 512, 300)
    assert _case(watch, device_mib, 200, "gqa") == (True, None)     # past 64, within 300: its first use
    assert MemoryWatch.for_run(RunConfig(testlist="gemm")).device_kind == "cpu"     # no device named: the CPU
