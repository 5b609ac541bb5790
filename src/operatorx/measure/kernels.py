"""Which kernels a call runs, from the same CUPTI records the timing used (`metrics["profile"]`).

Per kernel name: launches per call, device µs per call, and its launch shape (grid, block,
registers per thread, shared memory) as Kineto's trace export gives them. Flush and spin
kernels are not in it: the breakdown is built from the calls' own activities (measure/trace.py).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import numpy as np

from operatorx.measure.trace import TraceBatch

__all__ = ["kernel_breakdown", "export_trace", "profile_kernels"]

_LAUNCH_ARGS = {"grid": "grid", "block": "block", "registers per thread": "registers_per_thread",
                "shared memory": "shared_memory_bytes", "dynamic shared memory": "dynamic_shared_memory_bytes",
                "static shared memory": "static_shared_memory_bytes"}
_DEVICE_CATEGORIES = ("kernel", "gpu_memset", "gpu_memcpy")


def export_trace(batch: TraceBatch, path: Path) -> Path:
    """Write the batch's trace as Chrome-trace JSON (Perfetto opens it). Flush and spin kernels are
    in it too, under the `ox.flush` / `ox.spin` ranges; the calls are under `ox.call`. Kineto's
    writer does it: a run with `--trace` records with Kineto (measure/activity.py)."""
    if batch.profiler is None:
        raise ValueError(f"a {batch.source} batch has no trace writer; record with Kineto to export traces")
    path.parent.mkdir(parents=True, exist_ok=True)
    batch.profiler.export_chrome_trace(str(path))
    return path


def _launch_shapes(batch: TraceBatch) -> dict[str, dict[str, Any]]:
    """Kernel name -> launch shape: from the CUPTI records themselves, or from Kineto's trace
    export (its in-memory events do not carry it)."""
    from_records = {}
    for call in batch.calls:
        for a in call.activities:
            if a.shape is not None and a.name not in from_records:
                from_records[a.name] = {"grid": list(a.shape.grid), "block": list(a.shape.block),
                                        "registers_per_thread": a.shape.registers_per_thread,
                                        "shared_memory_bytes": a.shape.static_shared_memory_bytes
                                        + a.shape.dynamic_shared_memory_bytes,
                                        "dynamic_shared_memory_bytes": a.shape.dynamic_shared_memory_bytes,
                                        "static_shared_memory_bytes": a.shape.static_shared_memory_bytes}
    if from_records or batch.profiler is None:
        return from_records
    fd, name = tempfile.mkstemp(prefix="operatorx-trace-", suffix=".json")
    os.close(fd)
    try:
        batch.profiler.export_chrome_trace(name)
        with open(name, encoding="utf-8") as f:
            trace = json.load(f)
    finally:
        os.unlink(name)
    shapes: dict[str, dict[str, Any]] = {}
    for event in trace.get("traceEvents", []):
        if event.get("cat") not in _DEVICE_CATEGORIES or event.get("name") in shapes:
            continue
        args = event.get("args", {})
        shapes[event["name"]] = {ours: args[theirs] for theirs, ours in _LAUNCH_ARGS.items() if theirs in args}
    return shapes


def kernel_breakdown(batch: TraceBatch, launch_shapes: bool = True,
                     shapes_from: Optional[TraceBatch] = None) -> Optional[dict[str, Any]]:
    """Per-call kernel table of the batch's unstarved calls; None when no call has device work.

    When every call was starved (an op that waits on the host inside each call, which the timer
    then times with its gaps), the table is of those calls, as the timing was, and says so.
    The launch shapes come from `shapes_from` when given: a 2-call batch exports and parses in a
    fraction of the time of a timed batch of hundreds of calls.
    """
    with_work = [c for c in batch.calls if c.activities]
    calls = [c for c in with_work if not c.starved] or with_work
    if not calls:
        return None
    per_name: dict[str, dict[str, Any]] = {}
    for call in calls:
        for a in call.activities:
            k = per_name.setdefault(a.name, {"name": a.name, "launches": 0, "durations_us": []})
            k["launches"] += 1
            k["durations_us"].append(a.duration_ns / 1e3)
    shapes = _launch_shapes(shapes_from or batch) if launch_shapes else {}
    n = len(calls)
    kernels = []
    for k in per_name.values():
        kernels.append({"name": k["name"], "count_per_call": k["launches"] / n,
                        "device_us_per_call": float(np.sum(k["durations_us"])) / n,
                        "device_us_median": float(np.median(k["durations_us"])), **shapes.get(k["name"], {})})
    table = {"calls": n, "span_us_median": float(np.median([c.span_ns for c in calls])) / 1e3,
             "busy_us_median": float(np.median([c.busy_ns for c in calls])) / 1e3, "kernels": kernels}
    if calls[0].starved:
        table["host_gaps_included"] = True
    return table


def profile_kernels(fn: Callable[[], Any], calls: int = 3) -> list[dict[str, Any]]:
    """Run fn `calls` times under the profiler (untimed, no flush); one entry per distinct kernel,
    in launch order, with `launches_per_call` and `device_us_per_call`."""
    from operatorx.measure.trace import trace_batch

    table = kernel_breakdown(trace_batch(fn, calls, flush=None, spin_cycles=0), launch_shapes=False)
    if table is None:
        return []
    return [{"name": k["name"], "launches_per_call": k["count_per_call"],
             "device_us_per_call": k["device_us_per_call"]} for k in table["kernels"]]
