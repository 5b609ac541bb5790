"""Typed column values taken from a row's document form (`Row.to_json()`) and from a run's `info`.

The document form is the source: the full row is stored beside these columns, which only copy out
what people filter, sort and plot on. Values of the wrong type are left NULL rather than guessed.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Optional

from operatorx.shown import shown_values

__all__ = ["case_key_of", "case_values", "row_values", "run_values", "RUN_FIELDS"]

# Run fields with their own column; everything else a document's "run" holds is `info`.
RUN_FIELDS = ("id", "started_at", "finished_at", "state", "testlist", "backend", "run_group", "shard")


def case_key_of(row: dict[str, Any]) -> str:
    """The case's identity, as `Case.key()` writes it: type and args as sorted compact JSON."""
    op = row["op"]
    return json.dumps({"type": op["type"], "args": op["args"]}, sort_keys=True, separators=(",", ":"))


def key_sha256(case_key: str) -> str:
    return hashlib.sha256(case_key.encode()).hexdigest()


def _num(v: Any) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _str(v: Any) -> Optional[str]:
    return v if isinstance(v, str) else None


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def case_values(row: dict[str, Any]) -> dict[str, Any]:
    op, key = row["op"], case_key_of(row)
    return {"key_sha256": key_sha256(key), "case_key": key, "type": op["type"], "label": _str(row.get("label")),
            "args": op["args"], "sources": list(op.get("sources") or [])}


def _model_role(sources: list[Any]) -> tuple[Optional[str], Optional[str]]:
    """`<checkpoint>/<role>` of the first source: the checkpoint may itself hold a '/'."""
    first = next((s for s in sources if isinstance(s, str) and s), None)
    if first is None:
        return None, None
    model, sep, role = first.rpartition("/")
    return (model, role) if sep else (first, None)


def row_values(row: dict[str, Any]) -> dict[str, Any]:
    """Column values of the `rows` table for one row document (without run_id and case_id)."""
    op, m = row["op"], _dict(row.get("metrics"))
    args, sources = _dict(op.get("args")), list(op.get("sources") or [])
    model, role = _model_role(sources)
    samples = m.get("samples_us")
    return {
        "backend": op["backend"], "side": row.get("side") or "", "case_index": int(row["case_index"]),
        "testlist": row.get("testlist") or "", "status": row["status"], "error_kind": _str(row.get("error_kind")),
        "message": _str(row.get("message")), "op_type": op["type"], "label": _str(row.get("label")),
        "scheme": _str(m.get("scheme")), "model": model, "role": role,
        "m": _int(args.get("m")), "n": _int(args.get("n")), "k": _int(args.get("k")),
        "tokens": _int(args.get("tokens")),
        **shown_values(m, stored_only=True),
        "samples_us": samples if isinstance(samples, list) else None, "sources": sources, "record": row,
    }


def _settings(info: dict[str, Any]) -> Optional[dict[str, Any]]:
    if isinstance(info.get("settings"), dict):
        return info["settings"]
    out: dict[str, Any] = {k: info[k] for k in ("timing", "filter", "limit", "host_timing", "ab_settings")
                           if k in info}
    return out or None


def run_values(info: dict[str, Any]) -> dict[str, Any]:
    """The typed provenance columns, read from a run's info (as `run/metadata.run_info` writes it,
    plus what a sweep adds: `run_group`, `shard`, GPU `uuid` / `pci_bus_id`)."""
    device, software = _dict(info.get("device")), _dict(info.get("software"))
    runtime = _str(device.get("runtime"))
    cuda = _str(software.get("cuda")) or (runtime.split(" ", 1)[1] if runtime and runtime.startswith("cuda ")
                                          else runtime)
    return {
        "kind": _str(info.get("kind")) or "run",
        "host": _str(info.get("host")),
        "gpu_name": _str(device.get("name")) if device.get("kind") != "cpu" else None,   # a CPU is no GPU
        "gpu_uuid": _str(device.get("uuid")),
        "gpu_pci_bus_id": _str(device.get("pci_bus_id")),
        "driver": _str(info.get("driver")) or _str(device.get("driver")),
        "cuda": cuda,
        "torch_version": _str(software.get("torch")),
        "vllm_version": _str(software.get("vllm")),
        "triton_version": _str(software.get("triton")),
        "operatorx_version": _str(software.get("operatorx")),
        "git_commit": _str(info.get("git_sha")) or _str(info.get("git_commit")),
        "settings": _settings(info),
    }
