"""`operatorx results compare A B`: per case, is B faster or slower than A (report/compare.py says how).

A and B are runs of the database (id, unique prefix, `latest`) or result documents (`.json` files:
a CI shard, a laptop's run). Two GPUs, backends or versions of one run group compare by passing
their two run ids. Exit 1 with `--fail-on-regression` when some case is `slower`; 2 for bad input.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from operatorx.cli.results import results_app
from operatorx.report.safe import plain
from operatorx.store.errors import RunNotFound, StoreError

__all__ = ["compare"]

_out = Console(width=None if sys.stdout.isatty() else 200)


class Metric(str, Enum):
    span = "span"
    busy = "busy"


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {plain(message)}", err=True)
    return typer.Exit(2)


def _load(which: str, ref: str, db: str) -> dict[str, Any]:
    """The document of `ref`: a .json file when one exists there, else a run of the database."""
    path = Path(ref)
    if ref.endswith(".json") or path.is_file():
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise _fail(f"{which} {ref}: no such file (give a result document or a run id of --db)") from None
        except (OSError, UnicodeDecodeError, ValueError) as err:
            raise _fail(f"{which} {ref}: not a result document ({type(err).__name__}: "
                        f"{str(err).splitlines()[0][:120]})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
            raise _fail(f"{which} {ref}: not a result document (no \"rows\" list); export one with "
                        "`operatorx results export RUN`")
        return doc
    try:
        from operatorx.store import Store

        return Store(db, create=False, read_only=True).document(ref)
    except (RunNotFound, StoreError) as err:
        raise _fail(f"{which} {ref}: {str(err).strip().splitlines()[0] if str(err).strip() else err}") from None


@results_app.command("compare")
def compare(
    a: str = typer.Argument(..., help="Baseline: run id, unique prefix, 'latest', or a result document .json."),
    b: str = typer.Argument(..., help="Contender, the same way."),
    db: str = typer.Option("operatorx.db", "--db", envvar="OPERATORX_DB",
                           help="SQLite path or URL holding the runs (default: $OPERATORX_DB, else operatorx.db)."),
    min_effect: float = typer.Option(0.02, "--min-effect",
                                     help="Smallest change that matters, as a fraction (0.02 = 2%)."),
    alpha: float = typer.Option(0.05, "--alpha", help="False discovery rate for faster/slower verdicts."),
    metric: Metric = typer.Option(Metric.span, "--metric",
                                  help="Compare span samples (default) or per-call busy time."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown instead of a table."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    as_csv: bool = typer.Option(False, "--csv", help="Print the comparison as CSV (one line per case, every flag)."),
    fail_on_regression: bool = typer.Option(False, "--fail-on-regression",
                                            help="Exit 1 when any case is slower (for CI)."),
) -> None:
    """Per case of two runs: B/A with a confidence interval, p and q values, and a verdict."""
    if not 0 <= min_effect < 1:
        raise _fail(f"--min-effect {min_effect:g}: give a fraction in [0, 1), e.g. 0.02 for 2%")
    if not 0 < alpha < 1:
        raise _fail(f"--alpha {alpha:g}: give a fraction in (0, 1), e.g. 0.05")
    if sum((markdown, as_json, as_csv)) > 1:
        raise _fail("--markdown, --json and --csv: choose one")
    from operatorx.report.compare import compare_documents
    from operatorx.report.compare_table import comparison_csv, comparison_markdown, comparison_table

    doc_a, doc_b = _load("A", a, db), _load("B", b, db)
    try:
        comp = compare_documents(doc_a, doc_b, min_effect=min_effect, alpha=alpha, metric=metric.value)
    except (ValueError, KeyError, TypeError) as err:    # a hand-made or damaged document
        why = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise _fail(f"cannot compare {a} and {b}: {why}") from None
    if as_json:
        typer.echo(json.dumps(comp.to_json(), indent=1, allow_nan=False))
    elif markdown:
        typer.echo(comparison_markdown(comp), nl=False)
    elif as_csv:
        typer.echo(comparison_csv(comp), nl=False)
    else:
        for flag in comp.flags:
            _out.print(f"note: {plain(flag)}", markup=False, highlight=False)
        _out.print(comparison_table(comp))
    if fail_on_regression and comp.regressions:
        typer.echo(f"{len(comp.regressions)} case(s) slower than {plain(comp.a)}", err=True)
        raise typer.Exit(1)
