"""Printers and exporters of results."""

from operatorx.report.table import fmt, rows_table

__all__ = ["fmt", "rows_table"]
