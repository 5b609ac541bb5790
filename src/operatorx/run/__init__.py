"""Orchestration: a sweep of a testlist over worker processes (one per GPU), one case at a time each."""

from operatorx.run.config import RunConfig
from operatorx.run.plan import select_cases
from operatorx.run.sweep import RunOutcome, resume_run, run_testlist

__all__ = ["RunConfig", "RunOutcome", "resume_run", "run_testlist", "select_cases"]
