"""`operatorx db init|upgrade|check|ingest`: the results database itself."""

from __future__ import annotations

from pathlib import Path

import typer

from operatorx.report.safe import plain
from operatorx.store import StoreError

__all__ = ["db_app"]

db_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                     help="Create, upgrade and check the results database; ingest documents.")
_DB = typer.Option("operatorx.db", "--db", envvar="OPERATORX_DB",
                   help="SQLite path, sqlite:///PATH, or postgresql://USER@HOST:PORT/DB (default: $OPERATORX_DB, "
                        "else operatorx.db).")


def fail(err: Exception) -> typer.Exit:
    """One line on stderr, exit code 2 (the caller raises what this returns)."""
    typer.echo(f"error: {plain(err)}", err=True)
    return typer.Exit(2)


@db_app.command("init")
def init(db: str = _DB) -> None:
    """Create the database at the current schema (on a PostgreSQL server, the database too)."""
    from operatorx.store.admin import init_database

    try:
        typer.echo(init_database(db))
    except StoreError as err:
        raise fail(err) from None


@db_app.command("upgrade")
def upgrade(db: str = _DB) -> None:
    """Bring an older database (also one from before schema versions) to the current schema."""
    from operatorx.store.admin import upgrade_database

    try:
        typer.echo(upgrade_database(db))
    except StoreError as err:
        raise fail(err) from None


@db_app.command("check")
def check(db: str = _DB) -> None:
    """Say whether the database is at the current schema (exit 0) or what to run (exit 2)."""
    from operatorx.store.admin import check_database
    from operatorx.store.db import state_error
    from operatorx.store.target import parse_db

    try:
        status = check_database(db)
    except StoreError as err:
        raise fail(err) from None
    if not status.current:
        raise fail(state_error(parse_db(db), status.state, status.revision))
    typer.echo(f"{status.where}: schema {status.revision} (current), {status.runs} runs, {status.rows} rows")


@db_app.command("ingest")
def ingest(documents: list[Path] = typer.Argument(..., help="Result documents (JSON) to store."),
           db: str = _DB) -> None:
    """Store result documents; a run ingested again replaces its earlier copy, whole."""
    from operatorx.store import Store
    from operatorx.store.ingest import prepare_document, read_document, store_document

    try:
        # every file read and checked before anything is stored: a bad file stores nothing
        prepared = [prepare_document(read_document(p), str(p)) for p in documents]
        store = Store(db)
        for prep in prepared:
            got = store_document(store, prep)
            c = got["counts"]
            done = "replaced" if got["replaced"] else "stored"
            # the file name, run id and state come from outside: printed without ESC, controls or bidi
            typer.echo(plain(f"{prep.where}: run {got['run_id']} ({got['state']}) {done}, "
                             f"{got['rows']} rows: {c['ok']} ok, {c['unsupported']} unsupported, "
                             f"{c['error']} error, {c['missing']} missing"))
    except StoreError as err:
        raise fail(err) from None
