"""Which GPU kernels a call launches, from torch.profiler: names and device time per call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["profile_kernels"]


def profile_kernels(fn: Callable[[], Any], calls: int = 3) -> list[dict[str, Any]]:
    """Run fn `calls` times under the profiler; one entry per distinct kernel, in launch order.

    `device_us_per_call` is the kernel's summed device time divided by `calls`.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels: dict[str, dict[str, Any]] = {}
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        k = kernels.setdefault(event.name, {"name": event.name, "count": 0, "device_us": 0.0})
        k["count"] += 1
        k["device_us"] += event.time_range.elapsed_us()
    return [{"name": k["name"], "launches_per_call": k["count"] / calls,
             "device_us_per_call": k["device_us"] / calls} for k in kernels.values()]
