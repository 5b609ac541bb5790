"""Rows as a Markdown table, for docs/benchmarks.md and issue notes. Formats only."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from operatorx.report.table import row_cells, row_columns, row_note

__all__ = ["rows_markdown"]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rows_markdown(rows: Iterable[dict[str, Any]], note_width: int = 120) -> str:
    rows = list(rows)
    columns = row_columns(rows)
    with_host = ("host_us", "right") in columns
    lines = ["| " + " | ".join(name for name, _ in columns) + " |",
             "|" + "|".join("---:" if justify == "right" else "---" for _, justify in columns) + "|"]
    for r in rows:
        cells = [*row_cells(r, with_host), row_note(r)[:note_width]]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"
