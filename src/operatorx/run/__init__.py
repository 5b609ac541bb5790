"""Orchestration: a run of a testlist, one case at a time."""

from operatorx.run.config import RunConfig
from operatorx.run.sweep import RunOutcome, run_testlist, select_cases

__all__ = ["RunConfig", "RunOutcome", "run_testlist", "select_cases"]
