"""`operatorx ab`: two implementations of each case in one process; differences with intervals."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from operatorx.measure import HostTimeSettings, TimingSettings
from operatorx.platform import resolve_device
from operatorx.report.ab import ab_table
from operatorx.run import select_cases
from operatorx.run.ab import ABSettings
from operatorx.run.ab_run import run_ab
from operatorx.run.ab_spec import parse_side
from operatorx.spec import Case, TestlistError, load_testlist, resolve_testlist
from operatorx.store import write_json_atomic

__all__ = ["ab_command"]

_out = Console(width=None if sys.stdout.isatty() else 200)
_err = Console(stderr=True)


def ab_command(
    a: str = typer.Option(..., "--a", help="Side A: backend, backend[k=v], py:FILE.py:FUNC or mod:PKG.MOD:FUNC@DIR."),
    b: str = typer.Option(..., "--b", help="Side B, same forms."),
    testlist: str = typer.Option(..., "--testlist", "-t", help="Shipped testlist name or path."),
    device: Optional[str] = typer.Option(None, "--device", help="cuda or cpu (default: cuda when there is a GPU)."),
    filter_text: Optional[str] = typer.Option(None, "--filter"),
    limit: Optional[int] = typer.Option(None, "--limit", min=1),
    batches: int = typer.Option(15, "--batches", min=6, help="Host batches per side (paired)."),
    batch_calls: int = typer.Option(200, "--batch-calls", min=1, help="Calls per host batch."),
    device_rounds: int = typer.Option(15, "--device-rounds", min=6, help="CUDA: timed rounds per side."),
    timing_mode: str = typer.Option("kernels", "--timing", help="CUDA device timer: kernels, events or graph."),
    l2: str = typer.Option("cold_clean", "--l2", help="L2 state before each call: cold_clean, cold_dirty or warm."),
    same_within: float = typer.Option(0.01, "--same-within", help="Verdict 'same' below this fraction of A."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Also write every result (all samples) here."),
    db: str = typer.Option("operatorx.db", "--db", help="SQLite path or SQLAlchemy URL; the A/B is stored as a run."),
    results_dir: Path = typer.Option(Path("operatorx-results"), "--results-dir"),
) -> None:
    """Compare A and B on every case: host and device time, B − A with a 95% interval, outputs."""
    try:
        side_a, side_b = parse_side(a), parse_side(b)
        settings = ABSettings(host=HostTimeSettings(batches=batches, batch_calls=batch_calls),
                              device_rounds=device_rounds, same_within_rel=same_within,
                              timing=TimingSettings(mode=timing_mode, l2_state=l2))  # type: ignore[arg-type]
        cases = select_cases(load_testlist(resolve_testlist(testlist)), filter_text, limit)
        device_kind = resolve_device(device)
    except TestlistError as err:
        for line in err.problems:
            _err.print(f"error {line}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(2) from err
    except (ValueError, RuntimeError) as err:
        _err.print(f"error: {err}", highlight=False, markup=False)
        raise typer.Exit(2) from err

    def started(index: int, case: Case) -> None:
        _err.print(escape(f"[{index}] {case.label()}"), highlight=False)

    def ended(results: list[dict]) -> None:
        if json_path is not None:   # rewritten after every case: a crash loses at most the case in flight
            write_json_atomic({"a": a, "b": b, "device": device_kind, "testlist": testlist, "results": results},
                              json_path)

    outcome = run_ab(cases, side_a, side_b, device_kind, settings, testlist, db, results_dir,
                     on_case=started, on_result=ended)
    _out.print(ab_table(outcome.results, title=escape(f"A = {a}   B = {b}   ({testlist}, {device_kind}; B − A in µs)")))
    _out.print(f"stored in {db} as run {outcome.run_id}; document {outcome.document_path}"
               + (f"; results in {json_path}" if json_path is not None else ""))
