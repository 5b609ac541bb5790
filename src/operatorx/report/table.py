"""Tables of rows for the terminal. Printers format; they never measure or add fields.

Rows come as typed `Row`s or as their document form (`Row.to_json()`, what `Store.document`
returns); both are read through the typed model. The headline time is the span (`latency_us`,
what a caller waits for) unless `headline="busy"` (the time some kernel ran: what a sum of
kernel durations, as Nsight Compute reports it, compares with). Where the two differ by more
than 3%, `busy_us` and `gaps_us` stand beside the headline and the note counts the kernels and
the boundaries between them, so a reader comparing with a profiler sees why. Where any row ran
over several ranks (`metrics.ranks`), `world` and `skew_us` (the median spread between the slowest
and the fastest rank) follow the times; they are blank on the other rows (report/ranks.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional, Union

from rich.table import Table

from operatorx.report.fit import FitTable, column_options
from operatorx.report.ranks import capped_note, ranks_of
from operatorx.report.safe import term
from operatorx.result import Headline, Row
from operatorx.shown import SHOWN_BY_KEY

__all__ = ["rows_table", "layers_table", "fmt", "row_cells", "row_columns", "row_note", "row_notes", "as_rows",
           "RowLike"]

RowLike = Union[Row, dict[str, Any]]
_STATUS_STYLE = {"ok": "green", "unsupported": "yellow", "error": "red", "missing": "magenta"}
_TITLE = {key: metric.title for key, metric in SHOWN_BY_KEY.items()}
#: The rates the table shows at the headline time (Row.rates_at); span_us and gaps_us are this
#: table's own views of latency_us and busy_us.
_RATES = ("tflops", "gbps", "pct_peak")


def fmt(value: Optional[float], digits: int = 1) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}" if abs(value) >= 1 else f"{value:.3g}"


def as_rows(rows: Iterable[RowLike]) -> list[Row]:
    """Typed rows from rows or their document form."""
    return [r if isinstance(r, Row) else Row.from_json(r) for r in rows]


def _kernels_note(r: Row) -> str:
    """`span 33.2 = busy 24.1 + gaps 9.1 µs between 9 kernels (8 boundaries)`: why span and busy differ."""
    text = f"span {fmt(r.latency_us, 1)} = busy {fmt(r.busy_us, 1)} + gaps {fmt(r.gaps_us, 1)} µs"
    profile = r.ran.profile if r.ran else None
    if profile is not None and profile.kernels:
        n = profile.kernels_per_call
        count = f"{n:.0f}" if abs(n - round(n)) < 0.05 else f"{n:.1f}"
        text += f" between {count} kernels ({max(0.0, n - 1):.0f} boundaries)"
    return text


def row_note(r: RowLike, headline: Headline = "span") -> str:
    """The row's notes, joined: the reason it did not run, and everything to know about its number."""
    return "; ".join(row_notes(r, headline))


def row_notes(r: RowLike, headline: Headline = "span") -> list[str]:
    """The row's notes, each whole: the one list that the terminal table, Markdown, CSV, the compare
    output and the pages all show, so a flag seen in one place is never missing from another."""
    row = r if isinstance(r, Row) else Row.from_json(r)
    notes: list[str] = []
    if row.status == "missing":
        notes.append("not run: planned, not finished")
    if row.message:
        notes.append(row.message)
    if row.status == "error" and row.error_kind and row.error_kind not in ("exception", "check"):
        notes.append(f"error kind: {row.error_kind}")
    host = row.host
    if host is not None and host.host_bound:
        notes.append("host-bound")
    if host is not None and host.warnings:
        notes.append("host: " + host.warnings[0])
    m = row.measured
    if row.status != "ok" or m is None:
        return notes
    if row.check is not None and row.check.checked is False:
        notes.append("output not checked")
    if m.clock == "host":
        notes.append("host clock (CPU)")
    if m.timing is not None and m.timing.cpu_contended:
        notes.append("CPU contended: " + (m.timing.cpu_contended_why or "most samples lost the CPU"))
    if headline == "busy" and m.busy_us is None:
        notes.append("busy time unknown: span shown")
    if row.busy_differs():
        notes.append(_kernels_note(row))
    cond = row.conditions
    if cond is not None and cond.capped and row.ranks is not None and row.ranks.capped_ranks:
        notes.append(capped_note(row.ranks))
    elif cond is not None and cond.capped:
        reasons = (cond.telemetry.capping_reasons if cond.telemetry else None) or ["?"]
        notes.append("clock capped: " + ",".join(reasons))
    if m.l2_verified is False:
        notes.append(f"L2 state {m.l2_state} not verified")
    ran = row.ran
    if ran is not None and ran.perturbed:
        notes.append("perturbed (ncu)")
    if ran is not None and ran.profile_error:
        notes.append(f"profile failed: {ran.profile_error}")
    timing = m.timing
    if timing is not None and timing.host_gaps_included:
        notes.append("host gaps included (op waits on host)")
    if timing is not None and timing.unattributed_activities:
        notes.append(f"{timing.unattributed_activities} device activities unattributed")
    noise, target = m.noise, timing.noise_target if timing is not None else None
    n = m.summary_us.n if m.summary_us is not None and m.summary_us.n is not None else "?"
    if m.stop_reason == "timeout":
        notes.append(f"timed out after {n} samples")
    elif m.stop_reason == "time_cap" and noise is None:
        notes.append(f"median noise unknown ({n} samples)")
    elif noise is not None and (m.stop_reason == "time_cap"
                                or (m.stop_reason == "max_samples" and target is not None and not noise <= target)):
        notes.append(f"median ±{100 * noise:.1f}%")
    return notes


def row_columns(rows: Iterable[RowLike], headline: Headline = "span") -> list[tuple[str, str]]:
    """(name, justify) of the columns rows_table and rows_markdown print for these rows."""
    typed = as_rows(rows)
    columns = [("#", "right"), ("case", "left"), ("scheme", "left")]
    if any(r.side for r in typed):
        columns.append(("side", "left"))
    columns += [("status", "left"), (_TITLE["busy_us" if headline == "busy" else "latency_us"], "right")]
    if any(r.busy_differs() for r in typed):
        columns += [("span_us" if headline == "busy" else _TITLE["busy_us"], "right"), ("gaps_us", "right")]
    if any(r.host is not None for r in typed):
        columns.append((_TITLE["host_us"], "right"))
    if any(r.ranks is not None for r in typed):
        columns += [("world", "right"), ("skew_us", "right")]
    return [*columns, *((_TITLE[k], "right") for k in _RATES), ("note", "left")]


def row_cells(r: RowLike, columns: list[tuple[str, str]], headline: Headline = "span",
              status: Optional[str] = None) -> list[str]:
    """The row's cells for `columns` (without the note), as plain text."""
    row = r if isinstance(r, Row) else Row.from_json(r)
    rates = row.rates_at(headline)
    differs = row.busy_differs()
    time_digits = SHOWN_BY_KEY["latency_us"].digits
    ranks = ranks_of(row)
    numbers: dict[str, Optional[float]] = {       # by shown metric (shown.py); rates at the headline time
        "latency_us": row.latency_us,
        "busy_us": row.headline_us("busy") if headline == "busy" else row.busy_us if differs else None,
        "host_us": row.host.host_us_per_call if row.host else None,
        **{k: getattr(rates, k) if rates else None for k in _RATES},
    }
    values: dict[str, str] = {
        "#": str(row.case_index),
        "case": row.label(),
        "scheme": row.scheme or row.case.scheme(),
        "side": row.side,
        "status": status or row.status,
        "span_us": fmt(row.latency_us if differs else None, time_digits),
        "gaps_us": fmt(row.gaps_us if differs else None, time_digits),
        "world": str(ranks.world) if ranks else "",
        "skew_us": fmt(ranks.skew_us, time_digits) if ranks else "",
        **{_TITLE[k]: fmt(v, SHOWN_BY_KEY[k].digits) for k, v in numbers.items()},
    }
    return [values[name] for name, _ in columns if name != "note"]


def rows_table(rows: Iterable[RowLike], title: Optional[str] = None, message_width: Optional[int] = None,
               headline: Headline = "span") -> Table:
    """One line per row; `headline` picks the leading time (`span` or `busy`) and the rates' time."""
    typed = as_rows(rows)
    columns = row_columns(typed, headline)
    t = FitTable(title=term(title) if title is not None else None, show_lines=False)
    for name, justify in columns:   # numbers never split; the note wraps, or folds below (report/fit.py)
        t.add_column(name, justify=justify, **column_options(name))  # type: ignore[arg-type]
    for r in typed:
        style = _STATUS_STYLE.get(r.status, "")
        cells = [term(c) for c in row_cells(r, columns, headline)]
        status_at = [name for name, _ in columns].index("status")
        cells[status_at] = f"[{style}]{r.status}[/{style}]" if style else r.status
        note = row_note(r, headline)
        t.add_row(*cells, term(note if message_width is None else note[:message_width]))
    return t


def layers_table(rows: Iterable[RowLike]) -> Optional[Table]:
    """Host µs per call of each layer, one line per (case, layer); None when no row has layers."""
    t = FitTable(title="host time by layer", show_lines=False)
    t.fold_column = "output vs public"
    for name, justify in (("#", "right"), ("case", "left"), ("layer", "left"), ("host_us", "right"),
                          ("iqr_us", "right"), ("output vs public", "left")):
        t.add_column(name, justify=justify, **column_options(name))  # type: ignore[arg-type]
    any_layer = False
    for r in as_rows(rows):
        for name, info in ((r.host.layers if r.host else None) or {}).items():
            any_layer = True
            vs = info.get("error") or info.get("output_vs_public", {}).get("result") or info.get("same_as", "")
            t.add_row(str(r.case_index), term(r.label()), term(name), fmt(info.get("host_us_per_call"), 2),
                      fmt(info.get("iqr_us"), 2), term(vs))
    return t if any_layer else None
