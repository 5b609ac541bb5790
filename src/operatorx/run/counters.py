"""Counters mode, the parent side: `operatorx run --counters` runs the same run as a child under
Nsight Compute, then files ncu's counters beside each row the child stored.

The parent times nothing: the child is a normal run (`--counters-child --run-id ID`) that, after
timing each ok case, calls the op once more inside `counters_replay_range(case_index)`. Rows are
stored by the child as each case ends, so a crash loses at most the case in flight; the parent
then patches those rows (one transaction) and rewrites the run's result document.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

from operatorx.measure.ncu import (
    CACHE_CONTROL,
    CLOCK_CONTROL,
    NcuCsvError,
    counters_replay_range,
    ncu_command,
    parse_ncu_csv,
    parse_ncu_version,
)
from operatorx.run.sweep import new_run_id
from operatorx.store import RunNotFound, Store, write_json_atomic
from operatorx.store.redact import hide_password
from operatorx.store.run_ids import document_path

__all__ = ["CountersError", "COUNTERS_FLAG", "CHILD_FLAG", "RUN_ID_OPTION", "child_command",
           "counters_patches", "run_with_counters"]

COUNTERS_FLAG = "--counters"
CHILD_FLAG = "--counters-child"
RUN_ID_OPTION = "--run-id"


class CountersError(RuntimeError):
    """Counters mode cannot start (no ncu) or cannot read what ncu wrote."""


def child_command(argv: list[str], run_id: str) -> list[str]:
    """`python -m operatorx run <argv without --counters> --counters-child --run-id ID`.

    `argv` is what followed `run` on the command line (a leading `run` is dropped too).
    """
    args = list(argv[1:] if argv[:1] == ["run"] else argv)
    for internal in (CHILD_FLAG, RUN_ID_OPTION):
        if any(a == internal or a.startswith(internal + "=") for a in args):
            raise ValueError(f"{internal} is set by --counters for its child; leave it out")
    args = [a for a in args if a != COUNTERS_FLAG]
    return [sys.executable, "-m", "operatorx", "run", *args, CHILD_FLAG, RUN_ID_OPTION, run_id]


def _db_by_env(child: list[str], db: str) -> tuple[list[str], dict[str, str]]:
    """The child's command and environment: a `--db` holding a password goes to the child as
    OPERATORX_DB instead of on its command line, which other users' `ps` shows and ncu's report keeps."""
    env = dict(os.environ)
    if hide_password(db) == db:
        return child, env
    out: list[str] = []
    skip = False
    for a in child:
        if skip:
            skip = False
        elif a == "--db":
            skip = True
        elif not a.startswith("--db="):
            out.append(a)
    env["OPERATORX_DB"] = db
    return out, env


def _ncu_version(ncu_path: str) -> Optional[str]:
    try:
        done = subprocess.run([ncu_path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_ncu_version(done.stdout + done.stderr)


def counters_patches(rows: list[dict[str, Any]], counters: dict[int, dict[str, Any]], tool: str,
                     child_rc: int) -> dict[int, dict[str, Any]]:
    """case_index → {"counters": ...} for the rows of a run (as its result document has them).

    A case ncu recorded gets the aggregate, its kernels and how ncu ran; an ok case it did not
    record gets `{"missing": why}`; other rows are left alone.
    """
    patches: dict[int, dict[str, Any]] = {}
    for row in rows:
        index = row["case_index"]
        if index in counters:
            patches[index] = {"counters": {**counters[index], "tool": tool, "clock_control": CLOCK_CONTROL,
                                           "cache_control": CACHE_CONTROL}}
        elif row.get("status") == "ok":
            why = f"ncu recorded no kernel in NVTX range {counters_replay_range(index)}"
            if child_rc != 0:
                why += f" (the run under ncu exited with {child_rc})"
            patches[index] = {"counters": {"missing": why}}
    return patches


def _read_counters(csv_path: Path, child_rc: int) -> dict[int, dict[str, Any]]:
    ended = f"; the run under ncu exited with {child_rc}" if child_rc != 0 else ""
    if not csv_path.is_file():
        raise CountersError(f"ncu wrote no report at {csv_path}{ended}; the stored rows have no counters")
    try:
        return parse_ncu_csv(csv_path.read_text(errors="replace"))
    except NcuCsvError as err:
        raise CountersError(f"cannot read ncu's CSV {csv_path}: {err}{ended}; "
                            "the stored rows have no counters") from err


def _stored_run(db: str, run_id: str) -> Optional[Store]:
    """The store, when the child began run `run_id` in it; a SQLite file the child never created
    stays uncreated (an invalid testlist stores nothing)."""
    if "://" not in db and not Path(db).expanduser().is_file():
        return None
    store = Store(db)
    try:
        store.resolve_run(run_id)
    except RunNotFound:
        return None
    return store


def run_with_counters(argv: list[str], db: str, results_dir: Path, ncu: str = "ncu") -> tuple[str, int]:
    """Run the run `argv` describes under ncu, then file the counters: (run id, child exit code).

    `db` and `results_dir` must be the ones `argv` gives the child (the CLI passes its parsed
    `--db` and `--results-dir`). ncu missing raises CountersError before anything runs or is
    stored; a child that fails keeps the rows it stored, and its exit code is returned; a CSV that
    cannot be read raises CountersError naming the file (which is then kept).
    """
    ncu_path = shutil.which(ncu)
    if ncu_path is None:
        raise CountersError(f"--counters needs Nsight Compute: {ncu!r} was not found on PATH or is not "
                            "executable (install ncu, or put its directory on PATH)")
    run_id = new_run_id()
    child, env = _db_by_env(child_command(argv, run_id), db)
    workdir = Path(tempfile.mkdtemp(prefix=f"ox-counters-{run_id}-"))
    csv_path = workdir / "ncu.csv"
    child_rc = subprocess.run(ncu_command(child, csv_path, ncu=ncu_path), env=env).returncode
    child_rc = 128 - child_rc if child_rc < 0 else child_rc          # killed by signal N: 128 + N, as shells say
    store = _stored_run(db, run_id)
    if store is None:                        # the child stopped before its run began: nothing to patch
        shutil.rmtree(workdir, ignore_errors=True)
        return run_id, child_rc
    counters = _read_counters(csv_path, child_rc)
    rows = store.document(run_id)["rows"]
    version = _ncu_version(ncu_path)
    tool = f"ncu {version}" if version else "ncu"
    store.patch_metrics(run_id, counters_patches(rows, counters, tool, child_rc))
    write_json_atomic(store.document(run_id), document_path(Path(results_dir), run_id))
    shutil.rmtree(workdir, ignore_errors=True)
    return run_id, child_rc
