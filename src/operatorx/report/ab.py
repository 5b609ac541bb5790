"""The A/B table: per case, each clock's two medians, the paired median difference B−A with its
interval, the verdict, and the notes: why a verdict was held back, the conditions, host warnings."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional

from rich.table import Table

from operatorx.report.fit import FitTable, column_options
from operatorx.report.safe import md_cell, term
from operatorx.report.table import fmt

__all__ = ["ab_markdown", "ab_table", "ab_notes", "DIFFERENCE_SAYS"]

_COLUMNS = ("case", "status", "host A", "host B", "host B−A [CI]", "host", "dev A", "dev B", "dev B−A [CI]",
            "device", "outputs, notes")
DIFFERENCE_SAYS = "B − A: paired median difference in µs (Hodges–Lehmann), with its 95% interval"
"""What a B−A column holds, for titles and pages."""
_VERDICT_STYLE = {"faster": "green", "slower": "red", "same": "", "inconclusive": "yellow"}


def _clock(d: Optional[dict[str, Any]], styled: bool = True) -> list[str]:
    if not d:
        return ["-", "-", "-", "-"]
    style = _VERDICT_STYLE.get(d["verdict"], "") if styled else ""
    verdict = f"[{style}]{d['verdict']}[/{style}]" if style else d["verdict"]
    diff = f"{d['diff_us']:+.2f} [{d['ci_low_us']:+.2f}, {d['ci_high_us']:+.2f}]"
    return [fmt(d["a_us"], 2), fmt(d["b_us"], 2), diff, verdict]


def ab_notes(r: dict[str, Any]) -> list[str]:
    """Everything to know beside a case's A/B numbers, whole: why it did not run, per clock why its
    verdict was held back and the conditions neither side controlled, and the host timer's warnings."""
    notes = [str(r["message"])] if r.get("status") != "ok" and r.get("message") else []
    for clock in ("host", "device"):
        d = r.get(clock)
        if not isinstance(d, dict):
            continue
        if d.get("verdict_why"):
            notes.append(f"{clock}: {d['verdict_why']}")
        notes += [f"{clock}: {c['text']}" for c in d.get("conditions") or [] if isinstance(c, dict) and c.get("text")]
        placement = d.get("placement")
        if isinstance(placement, dict) and placement.get("note"):
            notes.append(f"{clock}: {placement['note']}")
    host = r.get("host")
    warnings = host.get("warnings") if isinstance(host, dict) else None
    for side, said in (warnings or {}).items() if isinstance(warnings, dict) else ():
        notes += [f"host {str(side).upper()}: {w}" for w in said or []]
    return notes


def _outputs_notes(r: dict[str, Any]) -> str:
    """The outputs' comparison (an ok case), then the notes."""
    outputs = str((r.get("outputs") or {}).get("result", "")) if r["status"] == "ok" else ""
    return "; ".join(x for x in (outputs, *ab_notes(r)) if x)


def ab_table(results: Iterable[dict[str, Any]], title: Optional[str] = None) -> Table:
    """One line per case of `ABResult.to_json()`; differences are the paired median B − A in µs with the CI."""
    t = FitTable(title=title)
    t.fold_column = "outputs, notes"     # where the table cannot fit, they go below it, whole
    for name in _COLUMNS:
        t.add_column(name, justify="left" if name in ("case", "status", "outputs, notes") else "right",
                     **column_options(name))
    for r in results:
        t.add_row(term(r["label"]), term(r["status"]), *_clock(r.get("host")), *_clock(r.get("device")),
                  term(_outputs_notes(r)))
    return t


def ab_markdown(results: Iterable[dict[str, Any]]) -> str:
    """The A/B table as Markdown, for a report (same columns as `ab_table`, notes whole)."""
    lines = [md_cell(DIFFERENCE_SAYS) + ".", "", "| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    for r in results:
        cells = [r["label"], r["status"], *_clock(r.get("host"), False),
                 *_clock(r.get("device"), False), _outputs_notes(r)]
        lines.append("| " + " | ".join(md_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"
