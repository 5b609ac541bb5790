"""`run --host`: host µs per call of a case's public call and of its layers, beside device time.

Kept out of case.py so the runner only asks for `metrics["host"]`. The public call and every
layer are timed together, batch by batch in rotating order (measure/host_time.py), so they see
the same machine; each layer is called once first and its output compared with the public
call's, because a layer that computes something else says nothing about where time goes.
"""

from __future__ import annotations

from typing import Any, Optional

from operatorx.backends.base import Prepared
from operatorx.measure.host_time import HostTimeSettings, HostTiming
from operatorx.measure.measurement import Measurement
from operatorx.run.compare import compare_outputs

__all__ = ["host_metrics", "PUBLIC"]

PUBLIC = "public"


#: What the host timer says about batches that lost the CPU (measure/cpu_contention.py), per entry.
_CONTENTION_KEYS = ("contention_signal", "contended_batches_dropped", "contended_batches_kept", "rounds_dropped",
                    "cpu_wait_fraction", "cpu_contended", "cpu_contended_why")


def _entry(m: Measurement) -> dict[str, Any]:
    """One timed entry's numbers, and whether they lost the CPU: the public call and each layer
    are judged alike, so a layer's number never reads as clean when its batches were not."""
    return {"host_us_per_call": m.summary["median"], "iqr_us": m.summary["iqr"],
            "batch_us_per_call": m.samples_us, "summary_us": m.summary,
            **{k: m.details[k] for k in _CONTENTION_KEYS if k in m.details}}


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
        "batch_calls": public.details["batch_calls"],
        "device_us_per_call": device_us_per_call,
        "warnings": list(public.details["warnings"]),
        "gpu_paced": public.details["gpu_paced"],
        "drain_us_median": public.details["drain_us_median"],
    }
    if "batch_calls_reduced_from" in public.details:
        out["warnings"].append(f"batch_calls reduced from {settings.batch_calls} to "
                               f"{public.details['batch_calls']} to fit max_wall_s={settings.max_wall_s:g}")
    if device_kind != "cuda" or device_us_per_call is None:
        out["host_bound"] = None
        out["host_bound_why"] = "no GPU: host time is the whole call, there is no separate device time"
    else:
        out["host_bound"] = host_us > device_us_per_call
        if public.details["gpu_paced"]:
            out["warnings"].append("the GPU was still busy at the end of each batch: host time may include "
                                   "launch-queue back-pressure (device-bound at this batch size)")
    for name, info in layers.items():
        if name in measured:
            info.update(_entry(measured[name]))
            info["gpu_paced"] = measured[name].details["gpu_paced"]
        elif info.get("same_as") == PUBLIC:
            info.update(_entry(public))
    if layers:
        out["layers"] = layers
    return out
