"""The A/B table: per case, each clock's two medians, the difference with its interval, the verdict."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional

from rich.table import Table

from operatorx.report.fit import FitTable, column_options
from operatorx.report.safe import md_cell, term
from operatorx.report.table import fmt

__all__ = ["ab_markdown", "ab_table"]

_COLUMNS = ("case", "status", "host A", "host B", "host B−A [CI]", "host", "dev A", "dev B", "dev B−A [CI]",
            "device", "outputs")
_VERDICT_STYLE = {"faster": "green", "slower": "red", "same": "", "inconclusive": "yellow"}


def _clock(d: Optional[dict[str, Any]], styled: bool = True) -> list[str]:
    if not d:
        return ["-", "-", "-", "-"]
    style = _VERDICT_STYLE.get(d["verdict"], "") if styled else ""
    verdict = f"[{style}]{d['verdict']}[/{style}]" if style else d["verdict"]
    diff = f"{d['diff_us']:+.2f} [{d['ci_low_us']:+.2f}, {d['ci_high_us']:+.2f}]"
    return [fmt(d["a_us"], 2), fmt(d["b_us"], 2), diff, verdict]


def ab_table(results: Iterable[dict[str, Any]], title: Optional[str] = None) -> Table:
    """One line per case of `ABResult.to_json()`; differences are B − A in µs with the CI."""
    t = FitTable(title=title)
    t.fold_column = "outputs"        # where the table cannot fit, the outputs/reason go below it, whole
    for name in _COLUMNS:
        t.add_column(name, justify="left" if name in ("case", "status", "outputs") else "right",
                     **column_options(name))
    for r in results:
        outputs = (r.get("outputs") or {}).get("result", "") if r["status"] == "ok" else (r.get("message") or "")
        t.add_row(term(r["label"]), term(r["status"]), *_clock(r.get("host")), *_clock(r.get("device")),
                  term(outputs))
    return t


def ab_markdown(results: Iterable[dict[str, Any]]) -> str:
    """The A/B table as Markdown, for a report (same columns as `ab_table`)."""
    lines = ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    for r in results:
        outputs = (r.get("outputs") or {}).get("result", "") if r["status"] == "ok" else (r.get("message") or "")
        cells = [r["label"], r["status"], *_clock(r.get("host"), False),
                 *_clock(r.get("device"), False), outputs]
        lines.append("| " + " | ".join(md_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"
