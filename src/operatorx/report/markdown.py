"""Rows as a Markdown table, for docs/benchmarks.md and issue notes. Formats only."""

from __future__ import annotations

from collections.abc import Iterable

from operatorx.report.safe import md_cell
from operatorx.report.table import RowLike, as_rows, row_cells, row_columns, row_note
from operatorx.result import Headline

__all__ = ["rows_markdown"]


def rows_markdown(rows: Iterable[RowLike], headline: Headline = "span") -> str:
    """The columns and notes of `rows_table`; every cell escaped for Markdown (`safe.md_cell`). Notes are
    written whole: a Markdown viewer wraps a long cell, and a cut note can drop the one flag that matters."""
    typed = as_rows(rows)
    columns = row_columns(typed, headline)
    lines = ["| " + " | ".join(name for name, _ in columns) + " |",
             "|" + "|".join("---:" if justify == "right" else "---" for _, justify in columns) + "|"]
    for r in typed:
        cells = [*row_cells(r, columns, headline), row_note(r, headline)]
        lines.append("| " + " | ".join(md_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"
