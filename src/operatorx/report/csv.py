"""A result document as CSV: one line per row, the headline numbers; the JSON document keeps the rest.

Every cell goes through `safe.csv_cell`: text that a spreadsheet would run as a formula is
neutralised, and `sources` is a JSON list (a source containing `;` or `,` splits back exactly).
A/B runs (run kind `ab`) fill the a_/b_ columns from each row's A/B result, on the device clock
when it was measured, else the host clock; `latency_us` stays empty there (two sides, no one number).
`diff_us` is the paired median difference B−A (Hodges–Lehmann, run/ab_stats.py); `verdict_why`
says when a condition neither side controlled held the verdict back.
`notes` is every note the terminal table gives the row (report/table.py: `row_notes`), whole.
A multi-rank row (`metrics.ranks`) fills `world`, `split`, `latency_us_min`, `skew_us` and
`capped_ranks` (a JSON list) beside `latency_us`, the slowest rank's; other rows leave them empty.
"""

from __future__ import annotations

import csv
import io
from typing import Any, Optional

from operatorx.report.ranks import RANKS_CSV_FIELDS, ranks_csv, ranks_of
from operatorx.report.safe import csv_cell
from operatorx.shown import SHOWN, shown_values
from operatorx.spec import Case

__all__ = ["CSV_FIELDS", "document_csv"]

CSV_FIELDS = ["case_index", "type", "label", "m", "n", "k", "tokens", "scheme", "backend", "side", "status",
              *(metric.key for metric in SHOWN), *RANKS_CSV_FIELDS, "rank_local", "method", "clock", "checked",
              "error_kind", "message", "sources", "ab_clock", "a_latency_us", "b_latency_us", "diff_us", "ci_low_us",
              "ci_high_us", "verdict", "verdict_why", "notes"]


def _scheme(row: dict[str, Any]) -> Optional[str]:
    """The metrics' scheme, or the case's own (A/B rows carry none in metrics)."""
    scheme = row.get("metrics", {}).get("scheme")
    if scheme:
        return str(scheme)
    try:
        return Case.model_validate({"type": row["op"]["type"], "args": row["op"]["args"]}).scheme()
    except Exception:   # an older or partial document: leave the cell empty
        return None


def _rank_local(metrics: dict[str, Any]) -> Optional[str]:
    """`0/8 row-parallel ...`: the shard a --rank-local row timed; empty for a row of the whole case."""
    shard = metrics.get("rank_local")
    if not isinstance(shard, dict):
        return None
    return f"{shard.get('rank', 0)}/{shard.get('world', '?')} {shard.get('rule', '')}".strip()


def _ab(metrics: dict[str, Any]) -> dict[str, Any]:
    ab = metrics.get("ab")
    if not isinstance(ab, dict):
        return {}
    for clock in ("device", "host"):
        d = ab.get(clock)
        if isinstance(d, dict):
            return {"ab_clock": clock, "a_latency_us": d.get("a_us"), "b_latency_us": d.get("b_us"),
                    "diff_us": d.get("diff_us"), "ci_low_us": d.get("ci_low_us"), "ci_high_us": d.get("ci_high_us"),
                    "verdict": d.get("verdict"), "verdict_why": d.get("verdict_why")}
    return {}


def _notes(row: dict[str, Any]) -> Optional[str]:
    """The row's notes as the terminal table gives them, joined by `; `; none for a row this version
    cannot read (its other cells still say what it holds)."""
    from pydantic import ValidationError

    from operatorx.report.table import row_note

    try:
        return row_note(row) or None
    except (ValidationError, ValueError, KeyError, TypeError):
        return None


def document_csv(doc: dict[str, Any]) -> str:
    """One line per row of a result document (`Store.document`), headline numbers only."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore")
    w.writeheader()
    for row in doc["rows"]:
        args, m = row["op"]["args"], row.get("metrics", {})
        check = m.get("check")
        line = {
            "case_index": row.get("case_index"), "type": row["op"]["type"], "label": row.get("label"),
            "m": args.get("m"), "n": args.get("n"), "k": args.get("k"), "tokens": args.get("tokens"),
            "scheme": _scheme(row), "backend": row["op"].get("backend"), "side": row.get("side"),
            "status": row.get("status"), **shown_values(m), **ranks_csv(ranks_of(m)),
            "rank_local": _rank_local(m), "method": m.get("method"), "clock": m.get("clock"),
            "checked": check.get("checked", True) if isinstance(check, dict) else None,
            "error_kind": row.get("error_kind"), "message": row.get("message"),
            "sources": list(row["op"].get("sources") or []), **_ab(m), "notes": _notes(row),
        }
        w.writerow({k: csv_cell(v) for k, v in line.items()})
    return buf.getvalue()
