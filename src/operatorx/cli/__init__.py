"""The `operatorx` command: parse, call, print. The work lives in run/, store/, spec/."""

from __future__ import annotations

import warnings

import typer

from operatorx.cli.ab import ab_command
from operatorx.cli.db import db_app
from operatorx.cli.estimate import estimate_command
from operatorx.cli.results import results_app
from operatorx.cli.run import run_command
from operatorx.cli.testlist import testlist_app
from operatorx.cli.web import report_app, serve_command

__all__ = ["app", "main"]

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, add_completion=False,
                  help="Time single inference ops (GEMM, MoE) through the layers serving engines run. "
                       "Testlist format: docs/case-format.md; your own backend (--backend py:FILE.py:FUNC): "
                       "docs/user-backends.md.")
app.command("run")(run_command)
app.command("ab")(ab_command)
app.add_typer(testlist_app, name="testlist")
app.add_typer(results_app, name="results")
app.add_typer(db_app, name="db")
app.command("serve")(serve_command)
app.add_typer(report_app, name="report")
app.command("estimate")(estimate_command)


def _one_line_testlist_warnings() -> None:
    """A TestlistWarning (an unknown case key kept as metadata) prints as `warning: ...`, one line,
    instead of Python's `file:line: Category: message` plus a source line."""
    from operatorx.report.safe import plain
    from operatorx.spec import TestlistWarning

    default = warnings.formatwarning

    def format_warning(message, category, filename, lineno, line=None):  # type: ignore[no-untyped-def]
        if issubclass(category, TestlistWarning):
            return f"warning: {plain(message)}\n"
        return default(message, category, filename, lineno, line)

    warnings.formatwarning = format_warning


_one_line_testlist_warnings()


def main() -> None:
    app()
