"""Tables of rows for the terminal. Printers format; they never measure or add fields."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional

from rich.table import Table

__all__ = ["rows_table", "layers_table", "fmt", "row_cells", "row_columns", "row_note"]

_STATUS_STYLE = {"ok": "green", "unsupported": "yellow", "error": "red"}


def fmt(value: Optional[float], digits: int = 1) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}" if abs(value) >= 1 else f"{value:.3g}"


def _label(r: dict[str, Any]) -> str:
    """The row's case label (Row.to_json writes Case.label()); a short one for older documents."""
    if r.get("label"):
        return str(r["label"])
    op, a = r["op"], r["op"]["args"]
    if op["type"] == "gemm":
        return f"gemm {a['m']}x{a['n']}x{a['k']}"
    e = a["experts"]
    return f"moe T={a['tokens']} E={e['num']} k={e['top_k']} H={a['hidden']}"


def row_note(r: dict[str, Any]) -> str:
    """The row's notes, joined: the reason it did not run, and everything to know about its number."""
    m = r.get("metrics", {})
    notes: list[str] = []
    if r.get("message"):
        notes.append(r["message"])
    host = m.get("host", {})
    if host.get("host_bound"):
        notes.append("host-bound")
    if host.get("warnings"):
        notes.append("host: " + host["warnings"][0])
    if r["status"] == "ok":
        if m.get("check", {}).get("checked") is False:
            notes.append("output not checked")
        if m.get("clock") == "host":
            notes.append("host clock (CPU)")
        if m.get("capped"):
            reasons = m.get("telemetry", {}).get("capping_reasons") or ["?"]
            notes.append("clock capped: " + ",".join(reasons))
        if m.get("l2_verified") is False:
            notes.append(f"L2 state {m.get('l2_state')} not verified")
        if m.get("perturbed"):
            notes.append("perturbed (ncu)")
        if m.get("profile_error"):
            notes.append(f"profile failed: {m['profile_error'][:80]}")
        timing = m.get("timing") or {}
        if timing.get("host_gaps_included"):
            notes.append("host gaps included (op waits on host)")
        if timing.get("unattributed_activities"):
            notes.append(f"{timing['unattributed_activities']} device activities unattributed")
        noise, target = m.get("noise"), timing.get("noise_target")
        if m.get("stop_reason") == "timeout":
            notes.append(f"timed out after {m.get('summary_us', {}).get('n', '?')} samples")
        elif m.get("stop_reason") == "time_cap" and noise is None:
            notes.append(f"median noise unknown ({m.get('summary_us', {}).get('n', '?')} samples)")
        elif noise is not None and (m.get("stop_reason") == "time_cap"
                                    or (m.get("stop_reason") == "max_samples" and target is not None
                                        and not noise <= target)):
            notes.append(f"median ±{100 * noise:.1f}%")
    return "; ".join(notes)


def row_columns(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(name, justify) of the columns rows_table and rows_markdown print for these rows."""
    with_host = any("host" in r.get("metrics", {}) for r in rows)
    columns = [("#", "right"), ("case", "left"), ("scheme", "left"), ("status", "left"), ("latency_us", "right")]
    if with_host:
        columns.append(("host_us", "right"))
    return [*columns, ("TFLOP/s", "right"), ("GB/s", "right"), ("% peak", "right"), ("note", "left")]


def row_cells(r: dict[str, Any], with_host: bool, status: Optional[str] = None) -> list[str]:
    m = r.get("metrics", {})
    cells = [str(r.get("case_index", "")), _label(r), m.get("scheme", ""), status or r["status"],
             fmt(m.get("latency_us"), 2)]
    if with_host:
        cells.append(fmt(m.get("host", {}).get("host_us_per_call"), 2))
    return [*cells, fmt(m.get("tflops")), fmt(m.get("gbps")), fmt(m.get("pct_peak"))]


def rows_table(rows: Iterable[dict[str, Any]], title: Optional[str] = None, message_width: int = 60) -> Table:
    """One line per row of a result document (the JSON form of Row)."""
    rows = list(rows)
    columns = row_columns(rows)
    with_host = ("host_us", "right") in columns
    t = Table(title=title, show_lines=False)
    for name, justify in columns:
        t.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for r in rows:
        style = _STATUS_STYLE.get(r["status"], "")
        t.add_row(*row_cells(r, with_host, f"[{style}]{r['status']}[/{style}]"), row_note(r)[:message_width])
    return t


def layers_table(rows: Iterable[dict[str, Any]]) -> Optional[Table]:
    """Host µs per call of each layer, one line per (case, layer); None when no row has layers."""
    t = Table(title="host time by layer", show_lines=False)
    for name, justify in (("#", "right"), ("case", "left"), ("layer", "left"), ("host_us", "right"),
                          ("iqr_us", "right"), ("output vs public", "left")):
        t.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    any_layer = False
    for r in rows:
        host = r.get("metrics", {}).get("host", {})
        for name, info in host.get("layers", {}).items():
            any_layer = True
            vs = info.get("error") or info.get("output_vs_public", {}).get("result") or info.get("same_as", "")
            t.add_row(str(r.get("case_index", "")), _label(r), name, fmt(info.get("host_us_per_call"), 2),
                      fmt(info.get("iqr_us"), 2), str(vs)[:80])
    return t if any_layer else None
