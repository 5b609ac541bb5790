"""`operatorx run`: time a testlist on every GPU of this host (or a Ray cluster, or one shard of a
sweep), store every row as its case ends, print a table. `--resume` finishes a stopped run."""

from __future__ import annotations

import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from operatorx.backends.names import is_user_spec
from operatorx.cli.progress import make_reporter
from operatorx.measure.host_time import HostTimeSettings
from operatorx.measure.settings import TimingSettings
from operatorx.report.safe import plain
from operatorx.run.config import RunConfig, parse_shard
from operatorx.run.gpus import parse_gpus
from operatorx.run.sweep import RunOutcome, check_run_id, resume_run, run_testlist
from operatorx.spec.errors import TestlistError
from operatorx.store.errors import RunNotFound, StoreError
from operatorx.store.redact import hide_password

__all__ = ["run_command", "check_output_dir", "print_outcome"]

_out = Console(width=None if sys.stdout.isatty() else 200)
_err = Console(stderr=True)

BACKEND_HELP = ("torch (default), vllm (pip install -e \".[vllm]\"), or your own code: py:FILE.py:FUNC or "
                "mod:PKG.MOD:FUNC@DIR, optionally with [key=value,...] (docs/user-backends.md).")


def _fail(message: str, code: int = 2) -> typer.Exit:
    _err.print(f"error: {plain(hide_password(message))}", markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(code)


def check_output_dir(path: Path, option: str) -> None:
    """A directory the run will write into must be writable before the first case runs, not after
    the last."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".operatorx-write-check-"):
            pass
    except OSError as err:
        raise ValueError(f"{option} {path}: cannot write there ({err.strerror or err})") from err


def _run_counters(db: str, results_dir: Path) -> None:
    """`--counters`: this process only starts the run under ncu and then adds ncu's counters to its rows."""
    from operatorx.run.counters import run_with_counters

    run_id, code = run_with_counters(sys.argv[1:], db=db, results_dir=results_dir)
    _out.print(f"counters added to run {plain(run_id)}; stored in {plain(hide_password(db))}", markup=False)
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


#: A run with more rows than this prints its summary and the rows that need a look, not every row:
#: a terminal table of thousands of rows shows nothing (`results show` and the dashboard do).
FULL_TABLE_ROWS = 200


def print_outcome(outcome: RunOutcome, title: str, db: str, host: bool = False, headline: str = "span") -> None:
    """The table, the counts, where everything went, and how to resume a run that did not finish.
    `db` is printed in its display form: a password in it is never printed."""
    db = hide_password(db)
    from operatorx.report import layers_table, rows_table

    docs = outcome.row_docs                         # as the document holds them: nothing validated again
    total = len(docs)
    shown = docs if total <= FULL_TABLE_ROWS else [d for d in docs if d["status"] in ("error", "missing")][:50]
    if shown:
        if len(shown) < total:
            title = f"{title}: {len(shown)} of {total} rows (errors and missing cases)"
        _out.print(rows_table(shown, title=title, headline="busy" if headline == "busy" else "span"))
    if len(shown) < total:
        _out.print(f"all rows: operatorx results show {outcome.run_id} --db {plain(db)}", markup=False,
                   highlight=False)
    layers = layers_table(docs) if host else None
    if layers is not None:
        _out.print(layers)
    counts = ", ".join(f"{outcome.count(s)} {s}" for s in ("ok", "unsupported", "error", "missing"))
    document = plain(outcome.document_path) if outcome.document_written else "not written (below)"
    _out.print(f"{counts}; stored in {plain(db)}; document {document}", markup=False, highlight=False)
    if outcome.saved is not None:                   # a full disk, a failing store: where everything went
        _out.print(plain(outcome.saved), markup=False, highlight=False, soft_wrap=True)
    elif outcome.unstored:
        _out.print(f"{outcome.unstored} row(s) could not be stored in the database; the document holds them",
                   markup=False)
    if outcome.state != "finished":
        _out.print(f"run {outcome.run_id} {outcome.state}; resume it with: operatorx run --resume {outcome.run_id} "
                   f"--db {plain(db)}", markup=False, highlight=False)


def run_command(
    testlist: Optional[str] = typer.Option(None, "--testlist", "-t", help="Shipped testlist name or path."),
    backend: Optional[str] = typer.Option(None, "--backend", "-b", help=BACKEND_HELP + " With --resume: the "
                                          "run's backend, needed for a run this machine did not start."),
    device: Optional[str] = typer.Option(None, "--device", help="cuda or cpu (default: cuda when there is a GPU)."),
    filter_text: Optional[str] = typer.Option(None, "--filter",
                                              help="Keep cases whose label/scheme/sources contain this."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Run the first N selected cases only."),
    db: str = typer.Option("operatorx.db", "--db", envvar="OPERATORX_DB",
                           help="SQLite path or SQLAlchemy URL (postgresql://...); default: $OPERATORX_DB, "
                                "else operatorx.db."),
    results_dir: Path = typer.Option(Path("operatorx-results"), "--results-dir",
                                     help="Where the run's result document (RUN_ID.json) is written."),
    strict: bool = typer.Option(False, "--strict/--no-strict",
                                help="Exit 1 on any error row, any missing case, or when no row is ok."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="all (default) or GPU indices such as 0,1: one worker "
                                                            "process per GPU."),
    workers: int = typer.Option(1, "--workers", min=1, help="CPU device: worker processes (they share the cores)."),
    executor: str = typer.Option("local", "--executor",
                                 help="local (worker processes on this host), ray (one actor per GPU on a Ray "
                                      "cluster: pip install \"operatorx[ray]\") or inline (this process, no "
                                      "isolation: for debugging)."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address",
                                              help="Ray cluster to join (default: a local one)."),
    shard: Optional[str] = typer.Option(None, "--shard", help="I/N: run shard I of N (a stable hash of each case)."),
    run_group: Optional[str] = typer.Option(None, "--run-group", help="Name tying the shards of one sweep together."),
    resume: Optional[str] = typer.Option(None, "--resume",
                                         help="RUN_ID or latest: run the cases of that run that have no final row, "
                                              "with its settings."),
    case_timeout: Optional[float] = typer.Option(None, "--case-timeout", min=1,
                                                 help="Seconds a case may run before it is stopped (default: from "
                                                      "the timing budget, ~84 s)."),
    compile_grace: float = typer.Option(600.0, "--compile-grace", min=0,
                                        help="Seconds a case may run past its --case-timeout while its worker "
                                             "compiles kernels (a fresh machine's JIT cache); 0: never."),
    grace: float = typer.Option(10.0, "--grace", min=0, help="On SIGINT/SIGTERM, seconds the cases in flight get."),
    report: str = typer.Option("span", "--report", help="Headline time in the table: span (first kernel start to "
                                                        "last kernel end, default) or busy (kernels running)."),
    min_samples: int = typer.Option(10, "--min-samples", min=1, help="Timed calls per case, at least."),
    warmup_calls: int = typer.Option(5, "--warmup-calls", min=1, help="Untimed calls before timing, at least."),
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
    cpu_max_gb: float = typer.Option(4.0, "--cpu-max-gb", help="On CPU, cases moving more GB a call are unsupported."),
    host: bool = typer.Option(False, "--host", help="Also measure host µs per call, and per layer."),
    host_batches: int = typer.Option(15, "--host-batches", min=1, help="Host timing: batches (median over them)."),
    host_batch_calls: int = typer.Option(200, "--host-batch-calls", min=1, help="Host timing: calls per batch."),
    host_order: str = typer.Option("alternate", "--host-order", help="Host timing: alternate or fixed."),
    rank_local: bool = typer.Option(False, "--rank-local",
                                    help="Time one rank's shard of each split case (parallel tp·dp > 1) on one "
                                         "device, collectives left out; rows say `rank_local`. Without it such "
                                         "cases are unsupported with the GPUs they need."),
    placements: int = typer.Option(1, "--placements", min=1, max=8,
                                   help="Time each case at N operand placements (the case prepared N times at "
                                        "other device addresses, samples interleaved) and report the median "
                                        "over them. Runs meant for `results compare`: 3 or more."),
    recalibrate: bool = typer.Option(False, "--recalibrate",
                                     help="Measure each GPU's peaks again (bf16 and fp8 GEMM, HBM copy; cached per "
                                          "GPU and software stack) before its first case: docs/peaks.md."),
) -> None:
    """Time every case of a testlist; each row is stored when its case ends.

    One worker process per GPU (all visible by default) takes the next case as it frees up; a case
    that hangs, crashes or poisons its CUDA context ends as its own error row and the run goes on.
    """
    if report not in ("span", "busy"):
        raise _fail(f"--report {report}: use span or busy")
    reporter = make_reporter(_err)
    try:
        check_output_dir(results_dir, "--results-dir")
        if resume is not None:
            outcome = resume_run(resume, db, reporter, results_dir=results_dir, backend=backend)
            print_outcome(outcome, f"run {outcome.run_id} (resumed)", db, headline=report)
            _exit_strict(strict, outcome)
            return
        if testlist is None:
            raise ValueError("--testlist is required (or --resume RUN_ID)")
        backend = backend or "torch"
        timing = TimingSettings(min_samples=min_samples, max_samples=max(2000, min_samples), mode=timing_mode,  # type: ignore[arg-type]
                                l2_state=l2, noise_target=noise_target, max_time_s=max_time_s,  # type: ignore[arg-type]
                                warmup_calls=warmup_calls, spin=not no_spin)
        host_timing = HostTimeSettings(batches=host_batches, batch_calls=host_batch_calls, order=host_order)  # type: ignore[arg-type]
        if is_user_spec(backend):
            from operatorx.backends.py_file import load_user_function

            load_user_function(backend)          # a bad py:/mod: spec fails here, before the run starts
        if trace_dir is not None and not counters_child:
            _check_trace_dir(trace_dir, device, counters)
        if run_id is not None:
            check_run_id(run_id)
        if counters_child:
            # ncu holds CUPTI in the child: kernel-level timing, the kernel breakdown and the L2 probe
            # need it too, so the child times with events (its rows are marked perturbed anyway)
            timing = replace(timing, mode="events")
        config = RunConfig(testlist=testlist, backend=backend, device=device, filter=filter_text, limit=limit,
                           db=db, results_dir=results_dir, timing=timing, cpu_max_gflop=cpu_max_gflop,
                           cpu_max_gb=cpu_max_gb,
                           host=host, host_timing=host_timing, trace_dir=None if counters_child else trace_dir,
                           counters_child=counters_child, run_id=run_id, profile_kernels=not counters_child,
                           check_l2=not counters_child, executor=executor,  # type: ignore[arg-type]
                           gpus=parse_gpus(gpus), workers=workers, case_timeout_s=case_timeout,
                           compile_grace_s=compile_grace, grace_s=grace,
                           shard=parse_shard(shard) if shard else None, run_group=run_group,
                           ray_address=ray_address, recalibrate=recalibrate,
                           rank_local=rank_local, placements=placements)
        if counters:
            _run_counters(db, results_dir)
            return
        outcome = run_testlist(config, reporter)
    except TestlistError as err:
        for line in err.problems[:20]:
            _err.print(f"error {plain(line)}", highlight=False, markup=False, soft_wrap=True)
        if len(err.problems) > 20:
            _err.print(f"... and {len(err.problems) - 20} more problems (operatorx testlist validate lists them all)",
                       markup=False)
        _err.print("nothing was run or stored")
        raise typer.Exit(2) from err
    except (ValueError, RuntimeError, StoreError, RunNotFound, OSError) as err:
        raise _fail(str(err)) from err
    print_outcome(outcome, f"run {outcome.run_id} ({testlist}, {backend})", db, host=host, headline=report)
    _exit_strict(strict, outcome)


def _exit_strict(strict: bool, outcome: RunOutcome) -> None:
    if outcome.state == "interrupted":
        raise typer.Exit(130)
    if strict and (outcome.count("error") or outcome.count("missing") or outcome.count("ok") == 0):
        raise typer.Exit(1)


