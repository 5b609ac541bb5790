"""Printers and exporters of results.

The names load on first use: `operatorx.report.safe` (escaping for the terminal) is imported by
every command, and importing this package's tables with it cost each command the result models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from operatorx.lazy import lazy_names

if TYPE_CHECKING:
    from operatorx.report.markdown import rows_markdown
    from operatorx.report.table import fmt, layers_table, rows_table

__all__ = ["fmt", "layers_table", "rows_markdown", "rows_table"]

_HOME = {"rows_markdown": "operatorx.report.markdown", "fmt": "operatorx.report.table",
         "layers_table": "operatorx.report.table", "rows_table": "operatorx.report.table"}

__getattr__ = lazy_names(__name__, _HOME)
