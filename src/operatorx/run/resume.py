"""What `--resume` trusts: the command line, and the runs this machine started; never the database.

A stored run is data. Anyone who can write to a shared database, or hand over a document that
`db ingest` stores, decides what its run record says; and the record names code (the backend: a
`py:FILE.py:FUNC` or `mod:` spec imports and calls that file; an A/B's two sides) and places (the
trace directory, a Ray cluster's address, the results directory). So a resume takes those parts
from one of two places only:

- the run's entry in this machine's ledger of started runs, written when the run began
  (`$XDG_CACHE_HOME/operatorx/started-runs/RUN.json`, else `~/.cache/...`; one small file a run,
  readable by its owner only), used when it still names the backend the stored rows are for;
- the command line: `--backend` must then be given, and be exactly the backend the stored rows are
  for (a resume fills in those rows; another backend would leave them `missing`). The settings
  (timing, limits, device) still come from the stored record: numbers, not code. A trace directory
  and a Ray address recorded elsewhere are dropped, and the run says so.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from operatorx.backends.names import is_user_spec
from operatorx.run.job import JobSpec
from operatorx.store.run_ids import check_run_id, is_run_id, shown_run_id
from operatorx.user_cache import cache_root

__all__ = ["LEDGER_DIR_NAME", "ledger_dir", "remember_started", "started_here", "resume_spec"]

LEDGER_DIR_NAME = "started-runs"
_AB_PREFIX = "ab: "
_DEFAULT_RESULTS_DIR = Path("operatorx-results")


def ledger_dir() -> Path:
    """This user's ledger of the runs this machine started."""
    return cache_root(os.environ) / LEDGER_DIR_NAME


def remember_started(spec: JobSpec) -> None:
    """Record that this machine started `spec`'s run (its record form: no database password).
    Raises OSError when the cache cannot be written; the run goes on, and a resume will ask for
    `--backend`."""
    directory = ledger_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / f"{check_run_id(spec.run_id)}.json"
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")   # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"job": spec.to_json(), "backend": spec.backend_label}, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def started_here(run_id: str) -> Optional[JobSpec]:
    """The job this machine started as `run_id`, or None (never started here, or its entry unreadable)."""
    if not is_run_id(run_id):
        return None
    try:
        data = json.loads((ledger_dir() / f"{run_id}.json").read_text(encoding="utf-8"))
        spec = JobSpec.from_json(data["job"])
    except Exception:  # noqa: BLE001 - missing, unreadable or from another version: not known here
        return None
    return spec if spec.run_id == run_id else None


def _stored_job(run_id: str, info: dict[str, Any]) -> JobSpec:
    """The job a stored record describes; ValueError (one line) for one that cannot be read."""
    if "job" not in info:
        raise ValueError(f"run {run_id} was stored by an older OperatorX without its plan: it cannot be resumed")
    try:
        return JobSpec.from_json(info["job"])
    except Exception as err:  # noqa: BLE001 - whatever shape a stored record has, it is one bad run
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise ValueError(f"run {run_id}: its stored settings cannot be read ({type(err).__name__}: {first}): "
                         "start a new run instead") from None


def _foreign(run_id: str, stored_backend: str, info: dict[str, Any], backend: Optional[str],
             note: Callable[[str], None]) -> JobSpec:
    """The job of a run this machine did not start: the backend the command line names (which must be
    the stored rows' backend), the stored settings, no stored paths or addresses."""
    shown = shlex.quote(stored_backend)
    code = " (user code: give it only if you trust that file)" if _names_user_code(stored_backend) else ""
    if backend is None:
        raise ValueError(f"run {run_id} was not started on this machine, so its backend is not taken from the "
                         f"database: to resume it, give the backend its rows are for, --backend {shown}{code}")
    if backend != stored_backend:
        raise ValueError(f"--backend {backend}: run {run_id}'s rows are for backend {shown}; a resume runs the "
                         "backend the run began with (start a new run for another one)")
    job = _stored_job(run_id, info)
    config = job.config
    if backend.startswith(_AB_PREFIX):
        if job.ab is None or job.backend_label != backend:
            raise ValueError(f"run {run_id}: its stored A/B sides do not match its backend {shown}: start a new "
                             "run instead")
    else:
        job = replace(job, ab=None)
        config = replace(config, backend=backend)
    dropped = [what for what, value in (("--trace directory", config.trace_dir), ("Ray address", config.ray_address))
               if value is not None]
    if dropped:
        note(f"run {run_id} was started elsewhere: its stored {' and '.join(dropped)} are not used")
    return replace(job, config=replace(config, trace_dir=None, ray_address=None))


def _names_user_code(backend: str) -> bool:
    if backend.startswith(_AB_PREFIX):
        return any(is_user_spec(side.strip()) for side in backend[len(_AB_PREFIX):].split(" | "))
    return is_user_spec(backend)


def resume_spec(run_id: str, stored_backend: str, info: dict[str, Any], *, db: str, backend: Optional[str],
                results_dir: Optional[Path], note: Callable[[str], None]) -> JobSpec:
    """The job a resume of `run_id` runs: from this machine's ledger when it started the run with the
    backend its stored rows are for, else from the command line's `--backend` and the stored settings
    (module docstring). `run_id` is the stored one and is checked here (it names the document file).
    `db` and `results_dir` are this command's. Raises ValueError with one line."""
    if not is_run_id(run_id):
        raise ValueError(f"run id {shown_run_id(run_id)} (from the database) is not one OperatorX writes, and it "
                         "would name the result document's file: it cannot be resumed")
    local = started_here(run_id)
    if local is not None and local.backend_label == stored_backend:
        if backend is not None and backend != stored_backend:
            raise ValueError(f"--backend {backend}: run {run_id} was started with backend "
                             f"{shlex.quote(stored_backend)}; a resume runs the backend the run began with")
        job, recorded_dir = local, local.config.results_dir
    else:
        job, recorded_dir = _foreign(run_id, stored_backend, info, backend, note), _DEFAULT_RESULTS_DIR
    config = replace(job.config, db=db, results_dir=results_dir if results_dir is not None else recorded_dir,
                     run_id=run_id)
    return replace(job, config=config, run_id=run_id)
