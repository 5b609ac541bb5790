"""A `Comparison` as a terminal table or Markdown. Formats only: the verdicts come from compare.py."""

from __future__ import annotations

from typing import Optional

from rich.table import Table

from operatorx.report.compare import CaseComparison, Comparison
from operatorx.report.safe import md_cell, term
from operatorx.report.table import fmt

__all__ = ["comparison_table", "comparison_markdown", "comparison_summary"]

_COLUMNS = (("case", "left"), ("A µs", "right"), ("B µs", "right"), ("B/A [CI]", "right"), ("p", "right"),
            ("q", "right"), ("verdict", "left"), ("flags", "left"))
_STYLE = {"faster": "green", "slower": "red", "same": "", "ambiguous": "yellow", "missing": "magenta"}


def _p(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2g}" if value >= 1e-4 else "<1e-4"


def _ratio(c: CaseComparison) -> str:
    if c.ratio is None:
        return "-"
    ci = f" [{c.ci_low:.3f}, {c.ci_high:.3f}]" if c.ci_low is not None and c.ci_high is not None else " [-]"
    return f"{c.ratio:.3f}{ci}"


def _label(c: CaseComparison) -> str:
    return f"{c.label} ({c.side})" if c.side else c.label


def _cells(c: CaseComparison) -> list[str]:
    return [_label(c), fmt(c.a_latency_us, 2), fmt(c.b_latency_us, 2), _ratio(c), _p(c.p_value), _p(c.q_value),
            c.verdict, "; ".join(c.flags)]


def comparison_summary(comp: Comparison) -> str:
    counts = comp.counts()
    return (f"B={comp.b} against A={comp.a} ({comp.metric} time, min effect ±{100 * comp.min_effect:g}%, "
            f"alpha {comp.alpha:g}, FDR across {sum(counts.values()) - counts['missing']} cases): "
            + ", ".join(f"{n} {v}" for v, n in counts.items()))


def comparison_table(comp: Comparison, flag_width: int = 80) -> Table:
    t = Table(title=term(comparison_summary(comp)), show_lines=False)
    for name, justify in _COLUMNS:
        t.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for c in comp.cases:
        cells = [term(x) for x in _cells(c)]
        style = _STYLE.get(c.verdict, "")
        cells[6] = f"[{style}]{c.verdict}[/{style}]" if style else c.verdict
        cells[7] = cells[7][:flag_width]
        t.add_row(*cells)
    return t


def comparison_markdown(comp: Comparison) -> str:
    lines = [md_cell(comparison_summary(comp)), ""]
    lines += [f"- {md_cell(f)}" for f in comp.flags]
    if comp.flags:
        lines.append("")
    lines += ["| " + " | ".join(name for name, _ in _COLUMNS) + " |",
              "|" + "|".join("---:" if j == "right" else "---" for _, j in _COLUMNS) + "|"]
    lines += ["| " + " | ".join(md_cell(x) for x in _cells(c)) + " |" for c in comp.cases]
    return "\n".join(lines) + "\n"
