"""Result documents on disk (JSON) and flat exports (CSV)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["write_json_atomic", "document_csv"]


def write_json_atomic(data: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            # compact: Python's C encoder serves only unindented output (a 1,000-row document took
            # 0.56 s indented, 0.15 s so), and the document is read by programs (`results ingest`,
            # `report`, jq), not by eye
            f.write(json.dumps(data, default=str, separators=(",", ":")))
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def document_csv(doc: dict[str, Any]) -> str:
    """Moved to operatorx.report.csv (escaped cells, sources as JSON); kept here for callers."""
    from operatorx.report.csv import document_csv as _document_csv

    return _document_csv(doc)
