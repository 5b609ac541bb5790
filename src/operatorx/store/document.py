"""Result documents on disk (JSON) and flat exports (CSV)."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["write_json_atomic", "document_csv"]

_CSV_FIELDS = ["case_index", "type", "label", "m", "n", "k", "tokens", "scheme", "backend", "status",
               "latency_us", "tflops", "gbps", "pct_peak", "method", "clock", "checked", "message", "sources"]


def write_json_atomic(data: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def document_csv(doc: dict[str, Any]) -> str:
    """One line per row, the headline numbers only; the JSON document keeps the rest."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=_CSV_FIELDS)
    w.writeheader()
    for row in doc["rows"]:
        args, m = row["op"]["args"], row.get("metrics", {})
        w.writerow({
            "case_index": row.get("case_index"), "type": row["op"]["type"], "label": row.get("label"),
            "clock": m.get("clock"), "checked": m["check"].get("checked", True) if "check" in m else None,
            "m": args.get("m"), "n": args.get("n"), "k": args.get("k"),
            "tokens": args.get("tokens"), "scheme": m.get("scheme"), "backend": row["op"]["backend"],
            "status": row["status"], "latency_us": m.get("latency_us"), "tflops": m.get("tflops"),
            "gbps": m.get("gbps"), "pct_peak": m.get("pct_peak"), "method": m.get("method"),
            "message": row.get("message"), "sources": ";".join(row["op"].get("sources", [])),
        })
    return buf.getvalue()
