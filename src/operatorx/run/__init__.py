"""Orchestration: a sweep of a testlist over worker processes (one per GPU), one case at a time each.

The public names load on first use: a worker process imports `operatorx.run.worker`, and
importing the sweep (the store, SQLAlchemy) with it cost every worker's start about 0.4 s for
code it never runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from operatorx.lazy import lazy_names

if TYPE_CHECKING:
    from operatorx.run.config import RunConfig
    from operatorx.run.plan import select_cases
    from operatorx.run.sweep import RunOutcome, resume_run, run_testlist

__all__ = ["RunConfig", "RunOutcome", "resume_run", "run_testlist", "select_cases"]

_HOME = {"RunConfig": "operatorx.run.config", "select_cases": "operatorx.run.plan",
         "RunOutcome": "operatorx.run.sweep", "resume_run": "operatorx.run.sweep",
         "run_testlist": "operatorx.run.sweep"}

__getattr__ = lazy_names(__name__, _HOME)
