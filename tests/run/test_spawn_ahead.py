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
        at_load.append([s._starting is not None and s._starting.alive() for s in slots])
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
        procs.extend(s._starting.proc for s in slots if s._starting is not None)
        return original(cfg)

    monkeypatch.setattr(sweep, "_chosen", keep_procs)
    with pytest.raises(TestlistError, match="case 1: args.m"):
        sweep.run_testlist(config(tmp_path, bad, workers=2))
    assert len(procs) == 2 and all(p is not None and p.poll() is not None for p in procs)
    assert not Path(tmp_path / "res").exists()


def _slot(tmp_path, write_testlist) -> Slot:
    from operatorx.run.gpus import worker_env
    from operatorx.run.job import JobSpec

    spec = JobSpec(config=config(tmp_path, write_testlist([fp32(16)])), run_id="r", testlist="t")
    return Slot(spec=spec, env=worker_env(None, 1), name="cpu0", cpu_share=1)


@pytest.mark.parametrize("how", ["kill", "close"])
def test_a_worker_still_starting_is_reached_by_kill_and_close(tmp_path, write_testlist, how):
    """The grace after Ctrl-C kills the slots' workers; one that is still starting (the first of every
    slot is spawned ahead) must die too, and its slot thread must not go on to run a case with it."""
    import threading
    import time

    from operatorx.run.worker_process import WorkerStartError

    slot = _slot(tmp_path, write_testlist)
    slot.spawn_ahead()
    starting = slot._starting
    assert starting is not None and starting.proc is not None
    raised: list[BaseException] = []

    def take() -> None:
        try:
            slot.ensure_worker()
        except BaseException as err:  # noqa: BLE001 - what the slot thread sees
            raised.append(err)

    thread = threading.Thread(target=take)
    thread.start()
    time.sleep(0.3)                                   # the worker is importing torch: not ready yet
    getattr(slot, how)()
    thread.join(timeout=60)
    assert not thread.is_alive() and len(raised) == 1 and isinstance(raised[0], WorkerStartError)
    assert starting.proc.poll() is not None and slot.worker is None
    if how == "close":                                # a closed slot starts nothing more
        with pytest.raises(WorkerStartError, match="closed"):
            slot.ensure_worker()
    else:                                             # a killed one starts a fresh worker when asked
        assert slot.ensure_worker()["device_kind"] == "cpu" and slot.started_workers == 2
        slot.close()


def test_workers_beyond_the_number_of_cases_are_stopped_before_the_run(tmp_path, write_testlist, seen,
                                                                      monkeypatch):
    slots, _ = seen
    execute = sweep._execute
    at_execute: list[tuple[int, list[bool]]] = []

    def execute_(spec, store, tasks, reporter, run_slots=None):
        procs = [s._starting.proc for s in slots if s._starting is not None and s._starting.proc is not None]
        at_execute.append((len(run_slots or []), [p.poll() is None for p in procs]))
        return execute(spec, store, tasks, reporter, run_slots)

    monkeypatch.setattr(sweep, "_execute", execute_)
    outcome = sweep.run_testlist(config(tmp_path, write_testlist([fp32(16)]), workers=3))
    assert [r.status for r in outcome.rows] == ["ok"]
    assert at_execute == [(1, [True])]                # one slot runs; the other two workers are gone already
    assert len(slots) == 3 and all(s._closed and s.worker is None and s._starting is None for s in slots)
