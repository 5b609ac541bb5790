"""`run --host`: host µs per call of a case's public call and of its layers, beside device time.

Kept out of case.py so the runner only asks for `metrics["host"]`. The public call and every
layer are timed together, batch by batch in rotating order (measure/host_time.py), so they see
the same machine; each layer is called once first and its output compared with the public
call's, because a layer that computes something else says nothing about where time goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from operatorx.backends.base import Prepared
from operatorx.measure.host_time import HostTimeSettings, HostTiming
from operatorx.measure.measurement import Measurement
from operatorx.measure.record import HostTimeRecord
from operatorx.run.compare import compare_outputs

__all__ = ["host_metrics", "PUBLIC"]

PUBLIC = "public"



STABLE_SPREAD_PCT = 5.0
"""Batch IQR at most this share of the median: the host time repeats well enough to be compared."""


def host_bound(batch_us: Sequence[float], device_us: float, gpu_paced: bool) -> tuple[Optional[bool], Optional[str]]:
    """Whether the GPU waits for Python, decided only where the batches agree on it.

    A GPU still behind the host at the end of the batches means the host was ahead: not host-bound,
    whatever the batches read (they include the wait for a full launch queue, which follows the
    GPU's clock). Otherwise the answer must hold across the middle half of the batches: all of it
    above the device time (host-bound), or all below; a device time inside it is no answer."""
    if gpu_paced:
        return False, None
    q25, q75 = (float(v) for v in np.percentile(np.asarray(batch_us, dtype=np.float64), [25, 75]))
    if q25 > device_us:
        return True, None
    if q75 < device_us:
        return False, None
    return None, (f"the device time ({device_us:.2f} µs) lies inside the batches' middle half "
                  f"({q25:.2f}-{q75:.2f} µs per call): the host and the GPU take about as long")


def unstable_why(gpu_paced: bool, cpu_contended: bool, spread_pct: float, decided: bool = False) -> str:
    """What makes the host batches disagree, where it is known (`decided`: host_bound was still
    decided, so host and GPU are not about as long)."""
    if cpu_contended:
        return f"batch IQR {spread_pct:.1f}% of the median: the batches lost the CPU to other processes"
    if gpu_paced:
        return (f"batch IQR {spread_pct:.1f}% of the median: the GPU paced the host (a full launch queue), so "
                "the batches follow the GPU's clock and power, not Python")
    if decided:
        return (f"batch IQR {spread_pct:.1f}% of the median, with the GPU ahead and the CPU not contended: a cause "
                "not identified (the Python call's own variation); host_bound holds across the batches")
    return (f"batch IQR {spread_pct:.1f}% of the median, with the GPU ahead and the CPU not contended: the "
            "host and the GPU take about as long, and batches alternate between waiting and not")


def _entry(m: Measurement[HostTimeRecord]) -> dict[str, Any]:
    """One timed entry's numbers, and whether they lost the CPU: the public call and each layer
    are judged alike, so a layer's number never reads as clean when its batches were not."""
    return {"host_us_per_call": m.summary["median"], "iqr_us": m.summary["iqr"],
            "batch_us_per_call": m.samples_us, "summary_us": m.summary,
            **m.details.contention()}


def host_metrics(prepared: Prepared, device_kind: str, settings: HostTimeSettings,
                 device_us_per_call: Optional[float]) -> dict[str, Any]:
    """The `metrics["host"]` block: the public call's host time, the flag, and each layer's."""
    public_out = prepared.fn()
    to_time: dict[str, Any] = {PUBLIC: prepared.fn}
    layers: dict[str, dict[str, Any]] = {}
    for name, layer in prepared.layers.items():
        if layer is prepared.fn:                 # the public call listed as a layer: time it once
            layers[name] = {"same_as": PUBLIC}
            continue
        try:
            layers[name] = {"output_vs_public": compare_outputs(layer(), public_out)}
        except Exception as err:  # noqa: BLE001 - a layer that cannot run is that layer's result
            layers[name] = {"error": f"{type(err).__name__}: {str(err).strip()[:300]}"}
            continue
        to_time[name] = layer
    del public_out
    measured = HostTiming(settings, device_kind).measure_interleaved(to_time)
    public = measured[PUBLIC]
    host_us = public.summary["median"]
    out: dict[str, Any] = {
        **_entry(public),
        "method": public.method,
        "settings": settings.to_json(),
        "batch_calls": public.details.batch_calls,
        "device_us_per_call": device_us_per_call,
        "warnings": list(public.details.warnings),
        "gpu_paced": public.details.gpu_paced,
        "drain_us_median": public.details.drain_us_median,
    }
    if public.details.batch_calls_reduced_from is not None:
        out["warnings"].append(f"batch_calls reduced from {settings.batch_calls} to "
                               f"{public.details.batch_calls} to fit max_wall_s={settings.max_wall_s:g}")
    if device_kind != "cuda" or device_us_per_call is None:
        out["host_bound"] = None
        out["host_bound_why"] = "no GPU: host time is the whole call, there is no separate device time"
    else:
        out["host_bound"], why = host_bound(public.samples_us, device_us_per_call, public.details.gpu_paced)
        if why is not None:
            out["host_bound_why"] = why
        if public.details.gpu_paced:
            out["warnings"].append("the GPU was still busy at the end of each batch: host time may include "
                                   "launch-queue back-pressure (device-bound at this batch size)")
    spread = public.summary["iqr"] / host_us * 100 if host_us > 0 else 0.0
    out["spread_pct"] = spread
    out["stable"] = spread <= STABLE_SPREAD_PCT
    if not out["stable"]:
        out["unstable_why"] = unstable_why(public.details.gpu_paced, public.details.cpu_contended, spread,
                                           decided=out.get("host_bound") is not None and device_kind == "cuda")
    for name, info in layers.items():
        if name in measured:
            info.update(_entry(measured[name]))
            info["gpu_paced"] = measured[name].details.gpu_paced
        elif info.get("same_as") == PUBLIC:
            info.update(_entry(public))
    if layers:
        out["layers"] = layers
    return out
