"""`operatorx testlist validate|show|list|upgrade` (and `generate`/`from-config`, cli/catalog.py).

The format: docs/case-format.md. Every string from a file is printed through report.safe (a key
spelled `[/red]` prints as text); a bad file is one line per problem, at most 20 of them.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from operatorx.cli.catalog import register as register_catalog_commands
from operatorx.report.safe import term
from operatorx.spec.errors import TestlistError

# The case models load inside the commands (operatorx/spec/testlist.py): every command imports this
# module, to register these.

__all__ = ["testlist_app", "plural"]

testlist_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                           help="Check, inspect, convert and generate testlists (format: docs/case-format.md).")
_out = Console(width=None if sys.stdout.isatty() else 200, highlight=False)
_err = Console(stderr=True, highlight=False)


def plural(n: int, word: str) -> str:
    """`1 case`, `2 cases`."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _problems(lines: list[str], prefix: str = "[red]error[/red] ") -> None:
    for line in lines:
        _err.print(prefix + term(line), soft_wrap=True)


def _warning(line: str) -> None:
    _err.print("[yellow]warning[/yellow] " + term(line), soft_wrap=True)


@testlist_app.command("validate")
def validate(files: list[str] = typer.Argument(..., help="Testlist files or shipped names.")) -> None:
    """Validate testlists; every problem names the file, the case index and the field. Exit 1 if any fails.
    A case given more than once is one case (its copies' sources merged): the line says how many."""
    from operatorx.spec.testlist import read_testlist, resolve_testlist

    failed = False
    for name in files:
        try:
            testlist = read_testlist(resolve_testlist(name), on_warning=_warning)
            merged = testlist.merged_line()
            _out.print(f"[green]ok[/green] {term(name)}: {plural(len(testlist.cases), 'case')}"
                       + (f"; {merged}" if merged else ""), soft_wrap=True)
        except TestlistError as err:
            failed = True
            _problems(err.problems)
    if failed:
        raise typer.Exit(1)


@testlist_app.command("show")
def show(file: str = typer.Argument(..., help="A testlist file or shipped name.")) -> None:
    """Counts of cases by type and scheme, and the serving recipes that use them (duplicates merged,
    as a run holds them)."""
    from operatorx.spec.testlist import read_testlist, resolve_testlist

    try:
        testlist = read_testlist(resolve_testlist(file), on_warning=_warning)
    except TestlistError as err:
        _problems(err.problems)
        raise typer.Exit(1) from err
    cases = testlist.cases
    merged = testlist.merged_line()
    if merged:
        _out.print(merged, soft_wrap=True)
    counts = Counter((c.type, c.scheme()) for c in cases)
    t = Table(title=f"{term(file)}: {plural(len(cases), 'case')}")
    t.add_column("type")
    t.add_column("scheme", overflow="fold")
    t.add_column("cases", justify="right")
    for (op, scheme), n in sorted(counts.items()):
        t.add_row(op, term(scheme), str(n))
    _out.print(t)
    recipes = Counter(r for c in cases for r in c.recipes)
    if recipes:
        r = Table(title="serving recipes (metadata)")
        r.add_column("recipe", overflow="fold")
        r.add_column("cases", justify="right")
        for recipe, n in sorted(recipes.items()):
            r.add_row(term(recipe), str(n))
        _out.print(r)
    keys = sorted({k for c in cases for k in c.metadata})
    if keys:
        _out.print("other metadata keys: " + ", ".join(term(k) for k in keys), soft_wrap=True)


@testlist_app.command("list")
def list_shipped() -> None:
    """The testlists that ship with operatorx."""
    from operatorx.spec.testlist import load_testlist, shipped_testlists

    t = Table(box=None, show_header=True, pad_edge=False)
    t.add_column("name")
    t.add_column("cases", justify="right")
    t.add_column("path", overflow="fold")
    for name, path in sorted(shipped_testlists().items()):
        try:
            count = str(len(load_testlist(path, on_warning=lambda _m: None)))
        except TestlistError:
            count = "invalid"
        t.add_row(term(name), count, term(Path(path)))
    _out.print(t)


@testlist_app.command("upgrade")
def upgrade(
    old: Annotated[Path, typer.Argument(help="A testlist in an older flat format (moe_gemm, gemm dtype_a/...).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The descriptor-format testlist to write.")],
) -> None:
    """Convert the older flat formats to the descriptor format; what has no equivalent is an error."""
    from operatorx.spec.testlist import dump_testlist, parse_cases, read_json
    from operatorx.spec.upgrade import UpgradeError, upgrade_cases

    if output.exists() and output.is_dir():
        _fail(f"-o {output}: is a directory; give a file name")
    if not output.parent.is_dir():
        _fail(f"-o {output}: directory {output.parent} does not exist")
    try:
        data = read_json(old)
        converted, notes = upgrade_cases(data, str(old))
        cases = parse_cases(converted, str(output), on_warning=lambda _m: None)
    except (TestlistError, UpgradeError) as err:
        problems = err.problems
        _problems(problems)
        _err.print("nothing written")
        raise typer.Exit(2) from err
    try:
        dump_testlist(cases, output)
    except OSError as err:
        _fail(f"-o {output}: cannot write: {err.strerror or err}")
    for note in notes:
        _out.print(f"note: {term(note)}", soft_wrap=True)
    _out.print(f"wrote {plural(len(cases), 'case')} to {term(output)}")


def _fail(message: str) -> None:
    _err.print("[red]error[/red] " + term(message), soft_wrap=True)
    raise typer.Exit(2)


register_catalog_commands(testlist_app)
