"""A `Comparison` as a terminal table, Markdown or CSV. Formats only: the verdicts come from compare.py.
Every flag is written whole in each of them (a cut flag can drop the one condition that matters)."""

from __future__ import annotations

import csv
import io
from typing import Any, Optional

from rich.table import Table

from operatorx.report.compare import CaseComparison, Comparison
from operatorx.report.safe import csv_cell, md_cell, term
from operatorx.report.table import fmt

__all__ = ["comparison_table", "comparison_markdown", "comparison_summary", "comparison_csv", "COMPARE_CSV_FIELDS",
           "case_flags"]

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


def case_flags(c: CaseComparison) -> list[str]:
    """What the flags column says of a case: why its verdict was held back (when it was), then every flag."""
    return ([c.verdict_why] if c.verdict_why else []) + list(c.flags)


def _cells(c: CaseComparison) -> list[str]:
    return [_label(c), fmt(c.a_latency_us, 2), fmt(c.b_latency_us, 2), _ratio(c), _p(c.p_value), _p(c.q_value),
            c.verdict, "; ".join(case_flags(c))]


def comparison_summary(comp: Comparison) -> str:
    counts = comp.counts()
    return (f"B={comp.b} against A={comp.a} ({comp.metric} time, min effect ±{100 * comp.min_effect:g}%, "
            f"alpha {comp.alpha:g}, FDR across {sum(counts.values()) - counts['missing']} cases): "
            + ", ".join(f"{n} {v}" for v, n in counts.items()))


def comparison_table(comp: Comparison) -> Table:
    t = Table(title=term(comparison_summary(comp)), show_lines=False)
    for name, justify in _COLUMNS:
        t.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for c in comp.cases:
        cells = [term(x) for x in _cells(c)]
        style = _STYLE.get(c.verdict, "")
        cells[6] = f"[{style}]{c.verdict}[/{style}]" if style else c.verdict
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


COMPARE_CSV_FIELDS = ["case_key", "label", "side", "case_index_a", "case_index_b", "backend_a", "backend_b",
                      "a_latency_us", "b_latency_us", "a_samples", "b_samples", "ratio", "ci_low", "ci_high",
                      "p_value", "q_value", "verdict", "numbers_verdict", "verdict_why", "flags"]


def comparison_csv(comp: Comparison) -> str:
    """One line per case; `flags` holds every flag, joined by `; `. The comparison's own flags come first,
    as lines whose `label` is `(comparison)`."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COMPARE_CSV_FIELDS, extrasaction="ignore")
    w.writeheader()
    for flag in comp.flags:
        w.writerow({"label": "(comparison)", "flags": csv_cell(flag)})
    for c in comp.cases:
        line: dict[str, Any] = {k: v for k, v in c.to_json().items() if k in COMPARE_CSV_FIELDS}
        line["flags"] = "; ".join(c.flags)
        w.writerow({k: csv_cell(v) for k, v in line.items()})
    return buf.getvalue()
