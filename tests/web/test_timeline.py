"""The Case page's kernel timeline (web/timeline.py): kernels end to end in their stored order, each
as long as its device µs per call, classed by name; nothing drawn from a profile without kernels."""

from __future__ import annotations

import math

from operatorx.web.timeline import BASIS, kernel_timeline


def test_bars_laid_end_to_end_in_stored_order():
    tl = kernel_timeline({"calls": 4, "span_us_median": 30.0, "busy_us_median": 25.0, "kernels": [
        {"name": "topk", "count_per_call": 1.0, "device_us_per_call": 2.0},
        {"name": "fused_moe_kernel", "count_per_call": 2.0, "device_us_per_call": 20.0},
        {"name": "bad", "device_us_per_call": math.nan},                      # no time: no bar
        {"name": "void vllm::moe::moe_sum_vec_kernel<c10::BFloat16>", "count_per_call": 1.0,
         "device_us_per_call": 3.0}]})
    assert tl is not None
    assert [(b.kernel_class, b.start_us, b.duration_us, b.launches_per_call) for b in tl.bars] == [
        ("routing", 0.0, 2.0, 1.0), ("expert_gemm", 2.0, 20.0, 2.0), ("reduce", 22.0, 3.0, 1.0)]
    assert tl.total_us == 25.0 and tl.busy_us_median == 25.0 and tl.span_us_median == 30.0
    assert tl.to_json()["basis"] == BASIS and "expert_gemm" in tl.to_json()["classes"]


def test_no_kernels_no_timeline():
    assert kernel_timeline(None) is None
    assert kernel_timeline({"kernels": []}) is None
    assert kernel_timeline({"kernels": [{"name": "x"}]}) is None
