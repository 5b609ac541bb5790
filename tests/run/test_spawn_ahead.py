"""Workers are spawned before the parent loads the testlist and stores the plan, so their start-up
overlaps it; a run that then fails to plan leaves no worker behind (real worker processes, CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from operatorx.run import sweep
from operatorx.run.worker_process import Slot
from operatorx.spec import TestlistError
from tests.conftest import gemm
from tests.run.test_isolation import config, fp32


@pytest.fixture
def seen(monkeypatch):
    """The slots spawned ahead, and what each slot held when the testlist was loaded."""
    slots: list[Slot] = []
    at_load: list[list[bool]] = []
    spawn, chosen = sweep._spawned_ahead, sweep._chosen

    def spawned_ahead(spec):
        out = spawn(spec)
        slots.extend(out)           # type: ignore[arg-type]
        return out

    def chosen_(cfg):
        at_load.append([s._spawned is not None and s._spawned.alive() for s in slots])
        return chosen(cfg)

    monkeypatch.setattr(sweep, "_spawned_ahead", spawned_ahead)
    monkeypatch.setattr(sweep, "_chosen", chosen_)
    return slots, at_load


def test_workers_start_before_the_testlist_is_loaded_and_are_the_ones_that_run(tmp_path, write_testlist, seen):
    slots, at_load = seen
    outcome = sweep.run_testlist(config(tmp_path, write_testlist([fp32(16), fp32(24), fp32(32)]), workers=2))
    assert at_load == [[True, True]]                    # both were starting while the parent planned
    assert [r.status for r in outcome.rows] == ["ok", "ok", "ok"]
    assert [s.started_workers for s in slots] == [1, 1]    # the early worker ran the cases: none started twice


def test_a_testlist_that_fails_to_load_takes_the_early_workers_with_it(tmp_path, write_testlist, seen, monkeypatch):
    slots, _ = seen
    bad = write_testlist([gemm(), {**gemm(), "args": {**gemm()["args"], "m": "1"}}])
    procs = []
    original = sweep._chosen

    def keep_procs(cfg):
        procs.extend(s._spawned.proc for s in slots if s._spawned is not None)
        return original(cfg)

    monkeypatch.setattr(sweep, "_chosen", keep_procs)
    with pytest.raises(TestlistError, match="case 1: args.m"):
        sweep.run_testlist(config(tmp_path, bad, workers=2))
    assert len(procs) == 2 and all(p is not None and p.poll() is not None for p in procs)
    assert not Path(tmp_path / "res").exists()
