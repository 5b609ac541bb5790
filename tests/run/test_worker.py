"""What the worker adds to a row after its case: the memory reading, and a leak as the row's error."""

from __future__ import annotations

import json
from pathlib import Path

from operatorx.result import Row
from operatorx.run.memory_watch import MemoryDelta, MemoryReading
from operatorx.run.worker import finish_row

_MIB = 1 << 20
# an ok row of the H200 sweep of session 12 (gemm 256x7168x4096 bf16, samples trimmed to 16)
_ROW = Row.from_json(json.loads((Path(__file__).parent / "h200_ok_row.json").read_text()))


def _delta(device_growth_mib: float, host_growth_mib: float = 0.0) -> MemoryDelta:
    before = MemoryReading(host_rss_bytes=900 * _MIB, device_allocated_bytes=300 * _MIB)
    after = MemoryReading(host_rss_bytes=int((900 + host_growth_mib) * _MIB),
                          device_allocated_bytes=int((300 + device_growth_mib) * _MIB))
    return MemoryDelta(before, after)


def test_a_case_that_gave_its_memory_back_keeps_its_row_and_gains_the_reading():
    row, replace = finish_row(_ROW, _delta(0.5), device_limit_mib=64, host_limit_mib=512)
    assert not replace and row.status == "ok" and row.error_kind is None
    assert row.memory is not None and row.memory.device_growth_bytes == _MIB // 2
    before, after = _ROW.to_json(), row.to_json()
    assert after["metrics"].pop("memory")["before"]["host_rss_bytes"] == 900 * _MIB
    assert after == before                  # every other part as it was


def test_a_leak_makes_the_row_an_error_and_replaces_the_worker():
    row, replace = finish_row(_ROW, _delta(2048), device_limit_mib=64, host_limit_mib=512)
    assert replace and row.status == "error" and row.error_kind == "leak"
    assert row.message is not None and row.message.startswith("memory leak: the case left 2048 MiB of device memory")
    assert row.measured is not None and row.measured.latency_us == _ROW.measured.latency_us   # the number stays


def test_a_first_use_keeps_its_row_ok_and_its_worker_and_says_so():
    first = MemoryDelta(_delta(300).before, _delta(300).after, first_use=True)
    row, replace = finish_row(_ROW, first, device_limit_mib=256, host_limit_mib=2048)
    assert not replace and row.status == "ok" and row.error_kind is None
    assert row.memory is not None and row.memory.first_use is True and row.memory.device_growth_bytes == 300 * _MIB
