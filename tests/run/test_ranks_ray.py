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
