"""Run ids, and the file names built from them.

A run id names files (the result document `RUN.json`, traces `RUN-caseNNNNN.json`) and arrives from
places this process does not control: a document being ingested, a shared database a resume reads.
So it is checked wherever it is used, by one rule: 1-64 letters, digits, `.`, `_` or `-`, not
starting with `.` or `-`. Such a name has no `/`, no `..` and no control character, so a file named
after it stays in its directory.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["RUN_ID_RULE", "check_run_id", "is_run_id", "document_path", "trace_file_name", "shown_run_id"]

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
RUN_ID_RULE = "use 1-64 letters, digits, '.', '_' or '-' (not starting with '.' or '-')"
_SHOWN_CHARS = 80


def is_run_id(run_id: object) -> bool:
    return isinstance(run_id, str) and _RUN_ID.fullmatch(run_id) is not None


def shown_run_id(run_id: object) -> str:
    """A possibly hostile id as a message may print it: quoted, escaped (repr) and cut to 80 characters."""
    text = run_id if isinstance(run_id, str) else str(type(run_id).__name__)
    cut = text[:_SHOWN_CHARS]
    return repr(cut) + ("…" if len(text) > _SHOWN_CHARS else "")


def check_run_id(run_id: object) -> str:
    """`run_id` when it follows the rule; else ValueError naming it (escaped, cut) and the rule."""
    if not is_run_id(run_id):
        raise ValueError(f"run id {shown_run_id(run_id)}: {RUN_ID_RULE}")
    assert isinstance(run_id, str)
    return run_id


def _inside(directory: Path, path: Path) -> Path:
    """`path`, after checking it names an entry directly in `directory`; ValueError otherwise. (The
    entry itself is not resolved: writing replaces it, a link there included, and never follows it.)"""
    if path.name in ("", ".", "..") or path.parent.resolve() != directory.resolve():
        raise ValueError(f"{path} is not a file of {directory}")
    return path


def document_path(results_dir: Path, run_id: str) -> Path:
    """Where a run's result document goes: `results_dir/RUN.json`, never anywhere else."""
    return _inside(results_dir, results_dir / f"{check_run_id(run_id)}.json")


def trace_file_name(run_id: str, case_index: int) -> str:
    """The name of a case's `--trace` file: `RUN-caseNNNNN.json`."""
    return f"{check_run_id(run_id)}-case{case_index:05d}.json"
