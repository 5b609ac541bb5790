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
from operatorx.storable import all_storable, storable

__all__ = ["case_key_of", "case_values", "row_values", "run_values", "RUN_FIELDS", "NONE_SHOWN", "model_role",
           "int64_or_none", "key_sha256"]

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


_INT64 = (-(2**63), 2**63 - 1)


def int64_or_none(v: Any) -> Optional[int]:
    """An integer column's value: an int a signed 64-bit column holds (the spec refuses larger sizes;
    a document from elsewhere may still carry one), else None."""
    if not isinstance(v, int) or isinstance(v, bool):
        return None
    return v if _INT64[0] <= v <= _INT64[1] else None


def _str(v: Any) -> Optional[str]:
    return storable(v) if isinstance(v, str) else None


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def case_values(row: dict[str, Any], key: Optional[str] = None) -> dict[str, Any]:
    """Column values of the `cases` table for a row document's case; `key` is its case key when the
    caller knows it (else computed from the document: the same text)."""
    op = row["op"]
    key = case_key_of(row) if key is None else key
    return {"key_sha256": key_sha256(key), "case_key": key, "type": op["type"], "label": _str(row.get("label")),
            "args": op["args"], "sources": list(op.get("sources") or [])}


def model_role(sources: list[Any]) -> tuple[Optional[str], Optional[str]]:
    """`<checkpoint>/<role>` of the first source: the checkpoint may itself hold a '/'."""
    first = next((s for s in sources if isinstance(s, str) and s), None)
    if first is None:
        return None, None
    model, sep, role = first.rpartition("/")
    return (model, role) if sep else (first, None)


NONE_SHOWN = shown_values({}, stored_only=True)
"""The stored metrics of a row without any (a planned row): every one None."""
_TEXT_COLUMNS = ("backend", "side", "testlist", "error_kind", "message", "label", "scheme", "model", "role")


def _text(v: Any) -> Optional[str]:
    return v if isinstance(v, str) else None


def row_values(row: dict[str, Any]) -> dict[str, Any]:
    """Column values of the `rows` table for one row document (without run_id and case_id). Its text
    columns are storable: a Row's text already is (result.py); a document from elsewhere is checked
    here, once for all its text columns."""
    op, m = row["op"], row.get("metrics")
    m = m if isinstance(m, dict) else {}
    args = op.get("args")
    args = args if isinstance(args, dict) else {}
    sources = list(op.get("sources") or [])
    model, role = model_role(sources)
    samples = m.get("samples_us")
    out = {
        "backend": op["backend"], "side": row.get("side") or "", "case_index": int(row["case_index"]),
        "testlist": row.get("testlist") or "", "status": row["status"], "error_kind": _text(row.get("error_kind")),
        "message": _text(row.get("message")), "op_type": op["type"], "label": _text(row.get("label")),
        "scheme": _text(m.get("scheme")), "model": model, "role": role,
        "m": int64_or_none(args.get("m")), "n": int64_or_none(args.get("n")), "k": int64_or_none(args.get("k")),
        "tokens": int64_or_none(args.get("tokens")),
        **(shown_values(m, stored_only=True) if m else NONE_SHOWN),
        "samples_us": samples if isinstance(samples, list) else None, "sources": sources, "record": row,
    }
    texts = [out[c] for c in _TEXT_COLUMNS if isinstance(out[c], str)]
    if not all_storable(texts):
        for c in _TEXT_COLUMNS:
            if isinstance(out[c], str):
                out[c] = storable(out[c])
    return out


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
