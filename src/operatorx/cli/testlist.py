"""`operatorx testlist validate|show`."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from operatorx.cli.catalog import register as register_catalog_commands
from operatorx.spec import TestlistError, load_testlist, resolve_testlist, shipped_testlists

__all__ = ["testlist_app"]

testlist_app = typer.Typer(no_args_is_help=True, help="Check and inspect testlists.")
_out = Console(width=None if sys.stdout.isatty() else 200)
_err = Console(stderr=True)


@testlist_app.command("validate")
def validate(files: list[str] = typer.Argument(..., help="Testlist files or shipped names.")) -> None:
    """Validate testlists; every problem names the file, the case index and the field."""
    failed = False
    for name in files:
        try:
            cases = load_testlist(resolve_testlist(name))
            _out.print(f"[green]ok[/green] {name}: {len(cases)} cases")
        except TestlistError as err:
            failed = True
            for line in err.problems:
                _err.print(f"[red]error[/red] {line}", highlight=False, markup=True, soft_wrap=True)
    if failed:
        raise typer.Exit(1)


@testlist_app.command("show")
def show(file: str = typer.Argument(..., help="A testlist file or shipped name.")) -> None:
    """Counts of cases by type and scheme."""
    try:
        cases = load_testlist(resolve_testlist(file))
    except TestlistError as err:
        for line in err.problems:
            _err.print(f"error {line}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1) from err
    counts = Counter((c.type, c.scheme()) for c in cases)
    t = Table(title=f"{file}: {len(cases)} cases")
    t.add_column("type")
    t.add_column("scheme")
    t.add_column("cases", justify="right")
    for (op, scheme), n in sorted(counts.items()):
        t.add_row(op, scheme, str(n))
    _out.print(t)


@testlist_app.command("list")
def list_shipped() -> None:
    """The testlists that ship with operatorx."""
    for name, path in sorted(shipped_testlists().items()):
        _out.print(f"{name}\t{Path(path)}")


register_catalog_commands(testlist_app)
