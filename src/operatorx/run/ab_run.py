"""An A/B over a testlist, on the sweep's own path: planned, executed by workers (each case's
two sides in one worker process, so they share a GPU and its state), each row stored as its
case ends, the run closed with its document.

The run record says `kind: "ab"` with both sides' specs; each row's `metrics["ab"]` is the case's
`ABResult.to_json()` (both sides' checks, the output comparison, host and device differences with
their intervals and verdicts, all samples). `operatorx results show` prints such a run as the A/B
table.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Optional

from operatorx.run.ab import ABSettings
from operatorx.run.config import RunConfig
from operatorx.run.sweep import Reporter, RunOutcome, run_ab_pairs

__all__ = ["run_ab", "ab_settings_json"]


def ab_settings_json(settings: ABSettings) -> dict[str, Any]:
    """ABSettings as the JSON a worker rebuilds them from (and the run record keeps)."""
    return asdict(settings)


def run_ab(config: RunConfig, a: str, b: str, settings: ABSettings,
           reporter: Optional[Reporter] = None) -> RunOutcome:
    """Every selected case of `config.testlist` through both sides; see module doc."""
    return run_ab_pairs(config, a, b, ab_settings_json(settings), reporter)
