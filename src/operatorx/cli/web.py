"""`operatorx serve` and `operatorx report build`: the dashboard over a results database, read-only."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from operatorx.report.safe import plain
from operatorx.store.redact import hide_password

if TYPE_CHECKING:
    from operatorx.web import Queries

# The web stack and the database are imported inside the commands: every command imports this
# module, to register these.

__all__ = ["serve_command", "report_app"]

report_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Reports over stored runs.")
_DB = typer.Option("operatorx.db", "--db", envvar="OPERATORX_DB",
                   help="SQLite path or SQLAlchemy URL, opened read-only (default: $OPERATORX_DB, else operatorx.db).")


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {plain(message)}", err=True)
    return typer.Exit(2)


def _open(db: str) -> Queries:
    from operatorx.web import Queries, WebError

    try:
        return Queries.open(db)
    except WebError as err:
        raise _fail(str(err)) from None


def serve_command(db: str = _DB,
                  host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every one)."),
                  port: int = typer.Option(8000, "--port", min=0, max=65535, help="TCP port.")) -> None:
    """A read-only web dashboard over the results database: runs, rows, shapes, roofline, cases, compare."""
    import uvicorn

    from operatorx.web.app import create_app

    app = create_app(_open(db))
    try:                                     # uvicorn would log a bind failure and exit 1: say it in one line
        with socket.create_server((host, port)):
            pass
    except OSError as err:
        raise _fail(f"cannot listen on {host}:{port}: {err.strerror or err}; pick another --port or --host") \
            from None
    typer.echo(f"OperatorX dashboard on http://{host}:{port}/ (read-only {plain(hide_password(db))}); Ctrl-C stops it")
    uvicorn.run(app, host=host, port=port, log_level="warning")


@report_app.command("build")
def build_command(db: str = _DB,
                  runs: Optional[list[str]] = typer.Option(None, "--runs", help="Run id, prefix or 'latest' "
                                                           "(repeat, or comma-separate); all runs when omitted."),
                  output: Path = typer.Option(..., "-o", "--output", help="Directory to write (replaced)."),
                  compare: Optional[list[str]] = typer.Option(
                      None, "--compare", help="Compare pages: 'comparable' (default: each run against the newest "
                      "earlier run of the same testlist, backend and shard on another GPU or with other versions; "
                      "A/B runs and one group's shards are not paired), 'latest' (of those, the newest of each "
                      "testlist, backend and shard), 'previous' (each run against the one before it of the same "
                      "testlist, backend and shard), 'none', or A:B run pairs (repeat).")) -> None:
    """The dashboard as a static site that opens from disk (file://): the artifact for CI."""
    from operatorx.web import WebError
    from operatorx.web.site import build_site

    wanted = [r.strip() for arg in runs or [] for r in arg.split(",") if r.strip()]
    pairs: str | list[tuple[str, str]] = "comparable"
    if compare:
        if compare in (["comparable"], ["latest"], ["previous"], ["none"]):
            pairs = compare[0]
        elif all(c.count(":") == 1 and all(c.split(":")) for c in compare):
            pairs = [(c.split(":")[0], c.split(":")[1]) for c in compare]
        else:
            raise _fail(f"--compare {' '.join(compare)}: give comparable, latest, previous, none, or A:B run "
                        "pairs (repeat --compare)")
    queries = _open(db)
    t0 = time.perf_counter()
    try:
        site = build_site(queries, output, wanted or None, pairs)
    except WebError as err:
        raise _fail(str(err)) from None
    except OSError as err:
        raise _fail(f"cannot write {output}: {err.strerror or err}") from None
    for note in site.skipped:                 # one bad run is left out, never the whole site
        typer.echo(f"note: {plain(note)}", err=True)
    for p in site.pairings:
        typer.echo(plain(f"compare {p.b} against {p.a}: {p.why}"))
    groups = f", {site.groups} run groups" if site.groups else ""
    typer.echo(plain(f"{site.runs} runs, {site.pages} pages ({site.compares} comparisons{groups}) in "
                     f"{time.perf_counter() - t0:.1f} s: open {site.directory / 'index.html'}"))
