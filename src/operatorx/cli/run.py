"""`operatorx run`: time a testlist, store every row, print a table."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from operatorx.backends.py_file import is_user_spec, load_user_function
from operatorx.measure import HostTimeSettings, TimingSettings
from operatorx.report import layers_table, rows_table
from operatorx.result import Row
from operatorx.run import RunConfig, run_testlist
from operatorx.spec import Case, TestlistError

__all__ = ["run_command"]

_out = Console(width=None if sys.stdout.isatty() else 200)
_err = Console(stderr=True)


class _ProgressReporter:
    def __init__(self) -> None:
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), console=_err, transient=True)
        self._task = None

    def start(self, run_id: str, total: int) -> None:
        self._progress.start()
        self._task = self._progress.add_task(f"run {run_id}", total=total)

    def case_started(self, case: Case, index: int) -> None:
        self._progress.update(self._task, description=f"[{index}] {case.label()}")  # type: ignore[arg-type]

    def case_done(self, row: Row) -> None:
        self._progress.advance(self._task)  # type: ignore[arg-type]

    def finish(self) -> None:
        self._progress.stop()


def _run_counters(db: str, results_dir: Path) -> None:
    """`--counters`: this process only starts the run under ncu and then adds ncu's counters to its rows."""
    from operatorx.run.counters import run_with_counters

    run_id, code = run_with_counters(sys.argv[1:], db=db, results_dir=results_dir)
    _out.print(f"counters added to run {run_id}; stored in {db}")
    if code != 0:
        raise typer.Exit(code)


def _check_trace_dir(trace_dir: Path, device: Optional[str], counters: bool) -> None:
    """`--trace` where it cannot write a trace fails before the run, not as an error row per case
    (the trace is written after each case's timing) or as no trace at all."""
    if counters:
        raise ValueError("--trace cannot be combined with --counters: ncu holds CUPTI in that run, "
                         "so no trace is taken")
    if device == "cpu":
        raise ValueError("--trace needs a CUDA device (the CPU device is timed by the host clock, "
                         "with no device trace)")
    if trace_dir.exists() and not trace_dir.is_dir():
        raise ValueError(f"--trace {trace_dir}: exists and is not a directory")


def run_command(
    testlist: str = typer.Option(..., "--testlist", "-t", help="Shipped testlist name or path."),
    backend: str = typer.Option("torch", "--backend", "-b"),
    device: Optional[str] = typer.Option(None, "--device", help="cuda or cpu (default: cuda when there is a GPU)."),
    filter_text: Optional[str] = typer.Option(None, "--filter",
                                              help="Keep cases whose label/scheme/sources contain this."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1),
    db: str = typer.Option("operatorx.db", "--db", help="SQLite path or SQLAlchemy URL."),
    results_dir: Path = typer.Option(Path("operatorx-results"), "--results-dir"),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 on any error row or when no row is ok."),
    min_samples: int = typer.Option(10, "--min-samples", min=1),
    warmup_calls: int = typer.Option(5, "--warmup-calls", min=1),
    timing_mode: str = typer.Option("kernels", "--timing",
                                    help="kernels (CUPTI kernel spans, default), events (CUDA event pairs) "
                                         "or graph (the op in a CUDA graph, kernel spans)."),
    l2: str = typer.Option("cold_clean", "--l2", help="L2 state before each call: cold_clean, cold_dirty or warm."),
    noise_target: float = typer.Option(0.005, "--noise", help="Stop when the median is known to this (0.005 = 0.5%)."),
    max_time_s: float = typer.Option(1.0, "--max-time", help="Per-case cap on sampling seconds."),
    no_spin: bool = typer.Option(False, "--no-spin", help="No GPU spin ahead of the timed calls."),
    trace_dir: Optional[Path] = typer.Option(None, "--trace", help="Write a Perfetto-readable trace per case here."),
    counters: bool = typer.Option(False, "--counters",
                                  help="Replay each op once under Nsight Compute (ncu) and store its counters; "
                                       "latencies of such a run are marked perturbed."),
    counters_child: bool = typer.Option(False, "--counters-child", hidden=True),
    run_id: Optional[str] = typer.Option(None, "--run-id", hidden=True),
    cpu_max_gflop: float = typer.Option(50.0, "--cpu-max-gflop", help="On CPU, larger cases are unsupported."),
    host: bool = typer.Option(False, "--host", help="Also measure host µs per call, and per layer."),
    host_batches: int = typer.Option(15, "--host-batches", min=1, help="Host timing: batches (median over them)."),
    host_batch_calls: int = typer.Option(200, "--host-batch-calls", min=1, help="Host timing: calls per batch."),
    host_order: str = typer.Option("alternate", "--host-order", help="Host timing: alternate or fixed."),
) -> None:
    """Time every case of a testlist; each row is stored when its case ends."""
    try:
        timing = TimingSettings(min_samples=min_samples, max_samples=max(2000, min_samples), mode=timing_mode,  # type: ignore[arg-type]
                                l2_state=l2, noise_target=noise_target, max_time_s=max_time_s,  # type: ignore[arg-type]
                                warmup_calls=warmup_calls, spin=not no_spin)
        host_timing = HostTimeSettings(batches=host_batches, batch_calls=host_batch_calls, order=host_order)  # type: ignore[arg-type]
        if is_user_spec(backend):
            load_user_function(backend)          # a bad py:/mod: spec fails here, before the run starts
        if trace_dir is not None and not counters_child:
            _check_trace_dir(trace_dir, device, counters)
        if counters_child:
            # ncu holds CUPTI in the child: kernel-level timing, the kernel breakdown and the L2 probe
            # need it too, so the child times with events (its rows are marked perturbed anyway)
            timing = replace(timing, mode="events")
        config = RunConfig(testlist=testlist, backend=backend, device=device, filter=filter_text, limit=limit,
                           db=db, results_dir=results_dir, timing=timing, cpu_max_gflop=cpu_max_gflop,
                           host=host, host_timing=host_timing, trace_dir=None if counters_child else trace_dir,
                           counters_child=counters_child, run_id=run_id, profile_kernels=not counters_child,
                           check_l2=not counters_child)
        if counters:
            _run_counters(db, results_dir)
            return
        outcome = run_testlist(config, _ProgressReporter())
    except TestlistError as err:
        for line in err.problems:
            _err.print(f"error {line}", highlight=False, markup=False, soft_wrap=True)
        _err.print("nothing was run or stored")
        raise typer.Exit(2) from err
    except (ValueError, RuntimeError) as err:
        _err.print(f"error: {err}")
        raise typer.Exit(2) from err
    _out.print(rows_table([r.to_json() for r in outcome.rows], title=f"run {outcome.run_id} ({testlist}, {backend})"))
    layers = layers_table([r.to_json() for r in outcome.rows]) if host else None
    if layers is not None:
        _out.print(layers)
    ok, unsupported, errors = (outcome.count(s) for s in ("ok", "unsupported", "error"))
    _out.print(f"{ok} ok, {unsupported} unsupported, {errors} error; stored in {db}; "
               f"document {outcome.document_path}")
    if strict and (errors or ok == 0):
        raise typer.Exit(1)
