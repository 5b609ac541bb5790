"""Multi-rank cases under `--executor ray` for real, on a local Ray instance (loopback only): a tp2
split runs on two fresh actors in one STRICT_PACK placement group on one node (gloo on the CPU), the
group is reused for the split's next case and removed with the gang, single-rank cases run on the
ordinary actors, and a case larger than the node is refused with the count."""

from __future__ import annotations

import json

import pytest

from tests.run.test_ranks import _check_rank_numbers, _config, _singles, _tp

ray = pytest.importorskip("ray", reason='the ray executor needs Ray: pip install "operatorx[ray]"')

from operatorx.run import run_testlist  # noqa: E402
from tests.run.ray_local import local_ray_instance  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    with local_ray_instance(num_cpus=3):
        yield


def test_a_tp2_split_runs_on_two_actors_of_one_placement_group_on_one_node(tmp_path, write_testlist, local_ray):
    from ray.util.placement_group import placement_group_table

    path = write_testlist([_tp(8, 128, 256, 2, "mlp.gate_up_proj"), _tp(8, 128, 512, 2, "mlp.down_proj"),
                           _tp(4, 128, 512, 4, "self_attn.o_proj"), *_singles(4)])
    outcome = run_testlist(_config(tmp_path, path, workers=3, executor="ray", case_timeout_s=120))
    assert outcome.state == "finished"
    column, row, tp4, *singles = outcome.rows
    for r in (column, row):
        assert r.status == "ok", r.message
        assert r.check is not None and r.check.ok and "combined over 2 ranks" in r.check.reference
        _check_rank_numbers(r, 2)
        assert len({p.worker for p in r.ranks.per_rank}) == 2
        assert all(p.worker.startswith("ray") for p in r.ranks.per_rank)
    placed = column.ranks.placement_group
    assert placed is not None and placed.scheduler == "ray" and placed.strategy == "STRICT_PACK"
    assert row.ranks.placement_group == placed                    # the split's second case: the same gang, same group
    assert placed.node in {n["NodeID"] for n in ray.nodes()}
    # what Ray says of that group: two bundles of one CPU each, both on the node the actors reported,
    # and removed with the gang when its split had no more cases
    table = placement_group_table()[placed.id]
    assert table["strategy"] == "STRICT_PACK" and table["state"] == "REMOVED"
    assert table["bundles"] == {0: {"CPU": 1.0}, 1: {"CPU": 1.0}}
    assert set(table["bundles_to_node_id"].values()) == {placed.node}
    assert tp4.status == "unsupported" and tp4.ranks is None
    assert tp4.message == ("needs tp·dp = 4 CPU workers of one Ray node; this run has 3 on its largest node "
                           "(one slot per CPU of a node, by Ray's resources)")
    assert all(s.status == "ok" and s.ranks is None for s in singles), [s.message for s in singles]
    doc = json.loads(outcome.document_path.read_text())
    stored = doc["rows"][0]["metrics"]["ranks"]
    assert stored["world"] == 2 and stored["placement_group"]["id"] == placed.id


def _kill_actor(actor) -> None:
    """SIGKILL the process of a rank's actor (what the OOM killer or a crash does), and wait until Ray
    says it is dead, so the next call on it fails rather than races its death."""
    import os
    import signal
    import time

    os.kill(ray.get(actor.pid.remote(), timeout=30), signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get(actor.pid.remote(), timeout=5)
        except Exception:  # noqa: BLE001 - dead, as wanted
            return
        time.sleep(0.1)
    raise AssertionError("the killed actor still answers")


def test_a_rank_actor_that_dies_is_reseated_and_every_worker_stays_usable(tmp_path, write_testlist, local_ray,
                                                                           monkeypatch):
    """Two slots, one tp2 split of four cases, then single-rank cases. Rank 1's actor (in the gang's
    placement group, never restarted) is killed as the first case starts, in both its tries: that case
    is one error row naming rank 1. After the next case's rank 1 answers, its actor is killed again,
    between two cases of the group: the following case dissolves the group and seats fresh actors in
    a new placement group (never a try lost on the dead one). Every other tp2 case is ok in a group no
    killed actor sat in, and the single-rank cases run on the slots' own actors, outside any group."""
    from operatorx.run.ranks.gang import GangRunner
    from operatorx.run.ray_slot import RaySlot

    killed_in: list[str] = []                   # placement groups a killed actor sat in
    killed_between: list[tuple[int, str]] = []  # (case, its group) of the actor killed between two cases
    run_rank, run_single, run_gang = RaySlot.run_rank, RaySlot.run, GangRunner.run

    def faulty_rank(self, index, case, deadline_s, stop, rank):
        if rank["rank"] == 1 and index == 0:
            killed_in.append(str(self.where().placement_group))
            _kill_actor(self.actor)
        outcome = run_rank(self, index, case, deadline_s, stop, rank)
        if rank["rank"] == 1 and index != 0 and outcome.failure is None and not killed_between:
            killed_between.append((index, str(self.where().placement_group)))
            killed_in.append(killed_between[0][1])
            _kill_actor(self.actor)
        return outcome

    singles_on: list[tuple[str, object]] = []

    def single(self, index, case, deadline_s, stop):
        singles_on.append((self.name, self.where().placement_group))
        return run_single(self, index, case, deadline_s, stop)

    gang_outcomes: list[tuple[int, object, str]] = []

    def gang(self, members, task, *args, **kwargs):
        outcome = run_gang(self, members, task, *args, **kwargs)
        gang_outcomes.append((task.index, outcome.failure, outcome.detail))
        return outcome

    monkeypatch.setattr(RaySlot, "run_rank", faulty_rank)
    monkeypatch.setattr(RaySlot, "run", single)
    monkeypatch.setattr(GangRunner, "run", gang)
    # the faulted case is the largest, so it runs first (longest first), then the split's other three
    cases = [_tp(8, 128, 1024, 2, "mlp.down_proj"), _tp(8, 128, 512, 2, "mlp.down_proj"),
             _tp(8, 128, 384, 2, "mlp.down_proj"), _tp(8, 128, 256, 2, "mlp.down_proj"), *_singles(4)]
    outcome = run_testlist(_config(tmp_path, write_testlist(cases), workers=2, executor="ray", case_timeout_s=60))
    assert outcome.state == "finished" and len(outcome.rows) == 8
    faulted, *split_ok = outcome.rows[:4]
    assert faulted.status == "error" and faulted.error_kind == "crashed"
    assert faulted.message.startswith("crashed: the worker of rank 1 of 2 (ray"), faulted.message
    assert "the Ray actor died" in faulted.message and "(tried 2 times)" in faulted.message
    assert len(faulted.failures) == 2 and all("rank 1 of 2" in f and "actor died" in f for f in faulted.failures)
    assert len(killed_between) == 1 and len(killed_in) == 3
    # only the faulted case's two tries failed: no case lost a try on an actor that was already dead
    assert sorted(i for i, failure, _ in gang_outcomes if failure is not None) == [0, 0], gang_outcomes
    assert not [d for _, _, d in gang_outcomes if "could not start" in d]
    for r in split_ok:
        assert r.status == "ok", r.message
        _check_rank_numbers(r, 2)
        assert r.ranks.placement_group is not None
        if r.case_index == killed_between[0][0]:        # it ran before its rank 1's actor was killed
            assert r.ranks.placement_group.id == killed_between[0][1]
        else:                                           # the cases after it: on fresh actors, in a new group
            assert r.ranks.placement_group.id not in killed_in
    # the single-rank cases ran on the slots' own actors (outside any placement group), on both slots
    assert all(r.status == "ok" and r.ranks is None for r in outcome.rows[4:]), [r.message for r in outcome.rows[4:]]
    assert len(singles_on) >= 4 and all(group is None for _, group in singles_on), singles_on
    assert {name for name, _ in singles_on} == {"ray0", "ray1"}
