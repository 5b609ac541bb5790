"""`operatorx results list|show|export`: read the database, never measure."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from enum import Enum
from typing import TYPE_CHECKING, Optional

import typer
from rich.console import Console
from rich.markup import escape

from operatorx.report.safe import plain
from operatorx.store.errors import RunNotFound, StoreError

if TYPE_CHECKING:
    from operatorx.store import Store

# The database (SQLAlchemy) and the tables are imported inside the commands: `operatorx run` imports
# this module too, to register it, before it spawns its workers.

__all__ = ["results_app"]

results_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Stored runs and their rows.")
_out = Console(width=None if sys.stdout.isatty() else 200)
_DB = typer.Option("operatorx.db", "--db", envvar="OPERATORX_DB",
                   help="SQLite path, sqlite:///PATH, or postgresql://USER@HOST:PORT/DB (default: $OPERATORX_DB, "
                        "else operatorx.db).")


class ExportFormat(str, Enum):
    json = "json"
    csv = "csv"


def _open(db: str) -> Store:
    """The database, never created by a read command: a bad --db is one line and exit 2."""
    from operatorx.store import Store

    try:
        return Store(db, create=False, read_only=True)
    except StoreError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None


def _document(db: str, run: str) -> dict:
    """A run's document, or a run group's (`group:NAME`: every shard of a sweep, merged)."""
    from operatorx.store.group import GROUP_PREFIX, group_document

    try:
        store = _open(db)
        if run.startswith(GROUP_PREFIX):
            return group_document(store, run[len(GROUP_PREFIX):])
        return store.document(run)
    except RunNotFound as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    except StoreError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None


_LIST_COLUMNS = ("run", "started", "state", "testlist", "backend", "device", "gpu", "group", "rows", "ok", "unsup",
                 "error", "missing")
_RIGHT = {"rows", "ok", "unsup", "error", "missing"}


def _aligned(header: tuple[str, ...], body: list[list[str]]) -> str:
    """A plain aligned table (one line per run, columns two spaces apart): a thousand runs print in
    milliseconds, where a rich table takes over a second, and the lines stay grep- and cut-friendly."""
    from rich.cells import cell_len

    widths = [max([cell_len(h)] + [cell_len(r[i]) for r in body]) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        out = []
        for name, cell, w in zip(header, cells, widths, strict=True):
            pad = " " * (w - cell_len(cell))
            out.append(pad + cell if name in _RIGHT else cell + pad)
        return "  ".join(out).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in body]) + "\n"


@results_app.command("list")
def list_runs(db: str = _DB,
              limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Only the newest N runs."),
              as_json: bool = typer.Option(False, "--json", help="Print the runs as JSON.")) -> None:
    """Runs in the database, newest first, with their rows by status."""
    try:
        store = _open(db)
        shown = store.list_runs(limit=limit)
        total = len(shown) if limit is None or len(shown) < limit else store.run_count()
    except StoreError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(shown, indent=1))
        return
    body = []
    for r in shown:
        c = r["counts"]
        group = f"{r['run_group'] or '-'} {r['shard']}" if r["shard"] else (r["run_group"] or "-")
        body.append([plain(x) for x in (r["id"], r["started_at"], r["state"], r["testlist"], r["backend"],
                                        r["device"], r["gpu"] or "-", group, r["rows"], c["ok"], c["unsupported"],
                                        c["error"], c["missing"])])
    text = _aligned(_LIST_COLUMNS, body)
    if len(shown) < total:
        text += f"({total - len(shown)} older runs not shown; without --limit all are)\n"
    typer.echo(text, nl=False)


@results_app.command("show")
def show(run: str = typer.Argument("latest", help="Run id, unique prefix, 'latest', or group:NAME (every shard "
                                                "of a --run-group, merged)."), db: str = _DB,
         markdown: bool = typer.Option(False, "--markdown", help="Print a Markdown table instead.")) -> None:
    """A run's rows as a table."""
    from operatorx.report import rows_markdown, rows_table
    from operatorx.report.ab import DIFFERENCE_SAYS, ab_markdown, ab_table

    doc = _document(db, run)
    r = doc["run"]
    title = f"{r['id']}  {r['testlist']}  {r['backend']}  {(r.get('device') or {}).get('name', '')}"
    if r.get("kind") == "ab":                   # an A/B stored as a run: each row holds the case's A/B result
        results = [{"case_index": row.get("case_index"), **row["metrics"]["ab"]} for row in doc["rows"]]
        if markdown:
            typer.echo(ab_markdown(results), nl=False)
        else:
            _out.print(ab_table(results, title=escape(f"{title}   ({DIFFERENCE_SAYS})")))
        return
    if markdown:
        typer.echo(rows_markdown(doc["rows"]), nl=False)
        return
    _out.print(rows_table(doc["rows"], title=title))


@results_app.command("export")
def export(run: str = typer.Argument("latest", help="Run id, unique prefix, 'latest', or group:NAME."),
           fmt: ExportFormat = typer.Option(ExportFormat.json, "--format"),
           output: Optional[str] = typer.Option(None, "-o", "--output", help="File to write; stdout if omitted."),
           db: str = _DB) -> None:
    """The run's result document (json) or its headline numbers (csv)."""
    from operatorx.store import document_csv

    doc = _document(db, run)
    text = json.dumps(doc, indent=1) + "\n" if fmt is ExportFormat.json else document_csv(doc)
    if output:
        try:
            with open(output, "w") as f:
                f.write(text)
        except OSError as err:
            typer.echo(f"error: -o {plain(output)}: cannot write there ({err.strerror or err})", err=True)
            raise typer.Exit(2) from None
    else:
        typer.echo(text, nl=False)

import operatorx.cli.compare  # noqa: E402,F401  (registers `results compare` on results_app)
