"""`operatorx estimate RUN --scenario FILE`: a serving step's time from a run's rows (report/estimate.py).

RUN is a run of the database (id, unique prefix, `latest`, or group:NAME); FILE a scenario testlist
written by `operatorx testlist serving`. Bad input (no such run, a file that is not a scenario) is one
line and exit 2.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.table import Table

from operatorx.report.safe import plain, term
from operatorx.store.errors import RunNotFound, StoreError

__all__ = ["estimate_command"]

_out = Console(width=None if sys.stdout.isatty() else 200, highlight=False)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {plain(message)}", err=True)
    return typer.Exit(2)


def _shares_table(title: str, shares: list) -> Table:  # type: ignore[type-arg]
    table = Table(title=title, title_justify="left")
    table.add_column("part")
    table.add_column("time_us", justify="right")
    table.add_column("share", justify="right")
    for s in shares:
        table.add_row(term(s.name), f"{s.time_us:,.2f}", f"{100 * s.share:.1f}%")
    return table


def _print(result: object) -> None:
    from operatorx.report.estimate import Estimate

    assert isinstance(result, Estimate)
    _out.print(f"run {term(result.run)}  scenario {term(result.scenario_file)}", soft_wrap=True)
    for step in result.steps:
        _out.print(f"\n[bold]{term(step.step)}[/bold] step: {step.time_us:,.2f} µs; {term(step.coverage_line())}",
                   soft_wrap=True)
        if step.tokens is not None:
            per_s = step.tokens.tokens_per_s_per_gpu
            _out.print(f"tokens per dp rank {step.tokens.tokens_per_dp_rank}, "
                       f"{'-' if per_s is None else f'{per_s:,.1f}'} tokens/s per GPU ({term(step.tokens.rule)})",
                       soft_wrap=True)
        for a in step.attention:
            _out.print(f"attention {term(a.module)}: {a.used} used ({term(a.why)})", soft_wrap=True)
        _out.print(_shares_table("by op class", step.by_class))
        _out.print(_shares_table("by layer role", step.by_role))
        _out.print(f"not in the scenario (no op times them): {term('; '.join(step.not_in_scenario))}", soft_wrap=True)
        if step.unmeasured:
            table = Table(title="not measured (not in the step time)", title_justify="left")
            for col in ("op", "roles", "count", "status", "reason"):
                table.add_column(col, justify="right" if col == "count" else "left")
            for u in step.unmeasured:
                table.add_row(term(u.label), term(", ".join(u.roles)), str(u.count), term(u.status),
                              term(u.reason or ""))
            _out.print(table)


def estimate_command(
    run: str = typer.Argument(..., help="Run id, unique prefix, 'latest', or group:NAME."),
    scenario: str = typer.Option(..., "--scenario", help="A scenario testlist from `operatorx testlist serving`."),
    db: str = typer.Option("operatorx.db", "--db", envvar="OPERATORX_DB",
                           help="SQLite path or URL holding the runs (default: $OPERATORX_DB, else operatorx.db)."),
    as_json: bool = typer.Option(False, "--json", help="Print the estimate as JSON."),
) -> None:
    """Per serving step: Σ count × latency over the run's ok rows, by op class and layer role, tokens/s per GPU,
    and every op not measured (docs/serving.md, "Estimating a step")."""
    from operatorx.report.estimate import EstimateError, estimate
    from operatorx.result import Row
    from operatorx.spec.errors import TestlistError
    from operatorx.spec.testlist import load_testlist
    from operatorx.store import Store
    from operatorx.store.group import GROUP_PREFIX, group_document

    try:
        cases = load_testlist(scenario)
    except TestlistError as err:
        problems = err.all_problems or [f"{scenario}: not a testlist"]
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        first = problems[0]
        raise _fail(f"--scenario {first}{more}") from None
    try:
        store = Store(db, create=False, read_only=True)
        doc = group_document(store, run[len(GROUP_PREFIX):]) if run.startswith(GROUP_PREFIX) else store.document(run)
    except (RunNotFound, StoreError) as err:
        raise _fail(str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__) from None
    try:
        rows = [Row.from_json(r) for r in doc["rows"]]
        result = estimate(cases, rows, run=str(doc["run"].get("id") or run), file=scenario)
    except EstimateError as err:
        raise _fail(str(err)) from None
    if as_json:
        typer.echo(result.model_dump_json(indent=1))
    else:
        _print(result)
