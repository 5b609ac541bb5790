"""The Ray executor on a local Ray instance (loopback only): two CPU actors, each owning an isolated
worker process; a case that kills its actor is survived (Ray restarts the actor) and every other
case is ok."""

from __future__ import annotations

from pathlib import Path

import pytest

from operatorx.measure import TimingSettings
from operatorx.run import RunConfig, run_testlist
from tests.conftest import gemm
from tests.run.ray_local import local_ray_instance

ray = pytest.importorskip("ray", reason='the ray executor needs Ray: pip install "operatorx[ray]"')
PLANTED = Path(__file__).parent / "planted" / "misbehave.py"
FAST = TimingSettings(warmup_calls=1, warmup_floor_s=0, first_warmup_floor_s=0, min_samples=3, max_samples=5,
                      max_time_s=0)


@pytest.fixture(scope="module")
def local_ray():
    with local_ray_instance(num_cpus=2):
        yield


def fp32(m: int, n: int = 64) -> dict:
    return gemm(m=m, n=n, k=64, a={"dtype": "fp32"}, b={"dtype": "fp32"}, out="fp32")


def test_two_actors_run_the_list_and_survive_a_killed_actor(tmp_path, write_testlist, local_ray):
    cases = [fp32(16), fp32(17), fp32(7), fp32(18), fp32(19, 72), fp32(20, 80)]
    config = RunConfig(testlist=str(write_testlist(cases)), backend=f"py:{PLANTED}:build", device="cpu", workers=2,
                       executor="ray", db=str(tmp_path / "ox.db"), results_dir=tmp_path / "res", timing=FAST,
                       case_timeout_s=60)
    outcome = run_testlist(config)
    by_m = {r.case.args.m: r for r in outcome.rows}
    assert outcome.state == "finished"
    # m=7 kills the process that owns its worker (the actor): crashed, tried once more, then given up
    assert (by_m[7].status, by_m[7].error_kind) == ("error", "crashed")
    assert [by_m[m].status for m in (16, 17, 18, 19, 20)] == ["ok"] * 5
    workers = outcome.rows[0]
    assert workers.latency_us is not None
