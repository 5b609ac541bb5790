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
from operatorx.run.ab import ABSettings, run_ab_case
from operatorx.run.ab_spec import parse_side
from operatorx.spec import TestlistError, load_testlist, resolve_testlist
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
    device_rounds: int = typer.Option(15, "--device-rounds", min=6, help="CUDA: event-timed rounds per side."),
    same_within: float = typer.Option(0.01, "--same-within", help="Verdict 'same' below this fraction of A."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write every result (all samples) here."),
) -> None:
    """Compare A and B on every case: host and device time, B − A with a 95% interval, outputs."""
    try:
        side_a, side_b = parse_side(a), parse_side(b)
        settings = ABSettings(host=HostTimeSettings(batches=batches, batch_calls=batch_calls),
                              device_rounds=device_rounds, same_within_rel=same_within, timing=TimingSettings())
        cases = select_cases(load_testlist(resolve_testlist(testlist)), filter_text, limit)
        device_kind = resolve_device(device)
    except TestlistError as err:
        for line in err.problems:
            _err.print(f"error {line}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(2) from err
    except (ValueError, RuntimeError) as err:
        _err.print(f"error: {err}", highlight=False, markup=False)
        raise typer.Exit(2) from err
    results: list[dict] = []
    for index, case in cases:
        _err.print(escape(f"[{index}] {case.label()}"), highlight=False)
        results.append({"case_index": index, **run_ab_case(case, side_a, side_b, device_kind, settings).to_json()})
        if json_path is not None:   # rewritten after every case: a crash loses at most the case in flight
            write_json_atomic({"a": a, "b": b, "device": device_kind, "testlist": testlist, "results": results},
                              json_path)
    _out.print(ab_table(results, title=escape(f"A = {a}   B = {b}   ({testlist}, {device_kind}; B − A in µs)")))
    if json_path is not None:
        _out.print(f"results in {json_path}")
