"""Printers and exporters of results."""

from operatorx.report.markdown import rows_markdown
from operatorx.report.table import fmt, layers_table, rows_table

__all__ = ["fmt", "layers_table", "rows_markdown", "rows_table"]
