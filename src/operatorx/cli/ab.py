"""`operatorx ab`: two implementations of each case in one worker; differences with intervals.

It runs on the sweep's path (workers, isolation, store, resume), so an A/B survives what a run
survives and is stored as a run (`kind: ab`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from operatorx.cli.progress import make_reporter
from operatorx.cli.run import check_output_dir
from operatorx.report.safe import plain
from operatorx.run.config import RunConfig
from operatorx.run.gpus import parse_gpus
from operatorx.spec.errors import TestlistError
from operatorx.store.errors import StoreError
from operatorx.store.redact import hide_password

if TYPE_CHECKING:
    from operatorx.result import Row

# The A/B machinery (its sides' backends, the case models, the tables) is imported inside the
# command: every other command imports this module too, to register it.

__all__ = ["ab_command"]

_out = Console(width=None if sys.stdout.isatty() else 200)
_err = Console(stderr=True)

SIDE_HELP = ("a built-in backend (torch), one with settings (torch[allow_tf32=false]), or user code: "
             "py:FILE.py:FUNC or mod:PKG.MOD:FUNC@DIR, each optionally with [key=value,...]")


class _JsonAlongside:
    """The reporter, plus `--json`: every result so far rewritten after each case (a crash loses at
    most the case in flight)."""

    def __init__(self, inner: Any, path: Optional[Path], header: dict[str, Any]) -> None:
        self.inner, self.path, self.header = inner, path, header
        self.results: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def case_done(self, slot: str, row: Row) -> None:
        self.inner.case_done(slot, row)
        if row.ab is not None:
            self.results.append({"case_index": row.case_index, **row.ab})
            if self.path is not None:
                from operatorx.store.document import write_json_atomic

                write_json_atomic({**self.header, "results": self.results}, self.path)


def ab_command(
    a: str = typer.Option(..., "--a", help=f"Side A: {SIDE_HELP}."),
    b: str = typer.Option(..., "--b", help="Side B, in the same forms as --a."),
    testlist: str = typer.Option(..., "--testlist", "-t", help="Shipped testlist name or path."),
    device: Optional[str] = typer.Option(None, "--device", help="cuda or cpu (default: cuda when there is a GPU)."),
    filter_text: Optional[str] = typer.Option(None, "--filter", help="Keep cases whose label/scheme/sources "
                                                                     "contain this."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Run the first N selected cases only."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="all (default) or GPU indices such as 0,1."),
    batches: int = typer.Option(15, "--batches", min=6, help="Host batches per side (paired)."),
    batch_calls: int = typer.Option(200, "--batch-calls", min=1, help="Calls per host batch."),
    device_rounds: int = typer.Option(15, "--device-rounds", min=6, help="CUDA: timed rounds per side."),
    timing_mode: str = typer.Option("kernels", "--timing", help="CUDA device timer: kernels, events or graph."),
    l2: str = typer.Option("cold_clean", "--l2", help="L2 state before each call: cold_clean, cold_dirty or warm."),
    same_within: float = typer.Option(0.01, "--same-within", help="Verdict 'same' below this fraction of A."),
    placements: int = typer.Option(3, "--placements", min=1, max=8,
                                   help="CUDA: copies of each side at other device addresses; the device rounds "
                                        "cycle over them, and a difference within their spread is not called "
                                        "faster or slower (1: placement not controlled)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Also write every result (all samples) here."),
    db: str = typer.Option("operatorx.db", "--db", envvar="OPERATORX_DB",
                           help="SQLite path or SQLAlchemy URL (default: $OPERATORX_DB, else operatorx.db); the "
                                "A/B is stored as a run."),
    results_dir: Path = typer.Option(Path("operatorx-results"), "--results-dir",
                                     help="Where the run's result document is written."),
    executor: str = typer.Option("local", "--executor", help="local, ray or inline (as for run)."),
) -> None:
    """Compare A and B on every case: host and device time, the paired median difference B − A with a 95%
    interval, outputs."""
    from operatorx.measure.host_time import HostTimeSettings
    from operatorx.measure.settings import TimingSettings
    from operatorx.report.ab import DIFFERENCE_SAYS, ab_table
    from operatorx.run.ab import ABSettings
    from operatorx.run.ab_run import run_ab
    from operatorx.run.ab_spec import parse_side

    try:
        parse_side(a), parse_side(b)           # a bad side fails here, before anything runs
        settings = ABSettings(host=HostTimeSettings(batches=batches, batch_calls=batch_calls),
                              device_rounds=device_rounds, same_within_rel=same_within, placements=placements,
                              timing=TimingSettings(mode=timing_mode, l2_state=l2))  # type: ignore[arg-type]
        check_output_dir(results_dir, "--results-dir")
        if json_path is not None:
            check_output_dir(json_path.parent if str(json_path.parent) else Path("."), "--json")
        config = RunConfig(testlist=testlist, backend="ab", device=device, filter=filter_text, limit=limit, db=db,
                           results_dir=results_dir, gpus=parse_gpus(gpus), executor=executor)  # type: ignore[arg-type]
        reporter = _JsonAlongside(make_reporter(_err), json_path, {"a": a, "b": b, "testlist": testlist})
        outcome = run_ab(config, a, b, settings, reporter)
    except TestlistError as err:
        for line in err.problems[:20]:
            _err.print(f"error {plain(line)}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(2) from err
    except (ValueError, RuntimeError, StoreError, OSError) as err:
        _err.print(f"error: {plain(err)}", highlight=False, markup=False)
        raise typer.Exit(2) from err
    results = [{"case_index": r.case_index, **r.ab} for r in outcome.rows if r.ab is not None]
    _out.print(ab_table(results, title=escape(plain(f"A = {a}   B = {b}   ({testlist}; {DIFFERENCE_SAYS})"))))
    db = hide_password(db)                          # a password is never printed
    _out.print(f"stored in {plain(db)} as run {outcome.run_id}; document {plain(outcome.document_path)}"
               + (f"; results in {plain(json_path)}" if json_path is not None else ""), markup=False)
    if outcome.saved is not None:                   # a full disk, a failing store: where everything went
        _out.print(plain(outcome.saved), markup=False, highlight=False, soft_wrap=True)
    if outcome.state != "finished":
        _out.print(f"run {outcome.run_id} {outcome.state}; resume it with: operatorx run --resume "
                   f"{outcome.run_id} --db {plain(db)}", markup=False)
