"""The torch collective on CUDA: one rank on the worker's own NCCL group, and an all_reduce over two GPUs
through the multi-rank path (NCCL, NCCL_NVLS_ENABLE=0), as tests/run/test_ranks_gpu.py's W=2 test.
Skipped without CUDA (and the W=2 test without two GPUs)."""

from __future__ import annotations

import pytest

from operatorx.measure import TimingSettings
from operatorx.run import RunConfig, run_testlist

TIMING = TimingSettings(warmup_calls=2, warmup_floor_s=0, first_warmup_floor_s=0.2, max_time_s=0.3)


def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


def _coll(kind: str, elements: int, tp: int = 1, dtype: str = "bf16") -> dict:
    args: dict = {"kind": kind, "elements": elements, "dtype": dtype}
    if tp > 1:
        args["parallel"] = {"tp": tp}
    return {"type": "collective", "args": args, "sources": []}


@pytest.mark.gpu
def test_one_rank_collectives_run_on_the_workers_own_nccl_group(tmp_path, write_testlist):
    kinds = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
    path = write_testlist([_coll(kind, 1 << 20) for kind in kinds])
    outcome = run_testlist(RunConfig(testlist=str(path), device="cuda", gpus=(0,), db=str(tmp_path / "ox.db"),
                                     results_dir=tmp_path / "res", timing=TIMING))
    in_place, *copies = outcome.rows
    for row in outcome.rows:                        # checked before timing, whether or not it can be timed
        assert row.check.ok and row.check.rel_error == 0.0 and row.ranks is None
        assert row.extra["group"] == "nccl, one rank: this worker alone"
    # NCCL at one rank: an in-place sum is left as it is (no device work to time), an out-of-place
    # collective is a copy of the buffer
    assert in_place.status == "unsupported" and "launched no device work" in in_place.message
    for row in copies:
        assert row.status == "ok", row.message
        assert row.rates.busbw_gbps == 0.0 and row.rates.algbw_gbps > 0    # W=1: the bus factor is 0


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="needs two GPUs of one host")
def test_tp2_all_reduce_over_two_gpus(tmp_path, write_testlist):
    path = write_testlist([_coll("all_reduce", 1 << 24, tp=2), _coll("all_gather", 1 << 24, tp=2)])
    outcome = run_testlist(RunConfig(testlist=str(path), device="cuda", gpus=(0, 1), db=str(tmp_path / "ox.db"),
                                     results_dir=tmp_path / "res", timing=TIMING))
    reduce, gather = outcome.rows
    for row in outcome.rows:
        assert row.status == "ok", row.message
        assert row.check.ok and row.check.rel_error == 0.0
        assert row.ranks.world == 2 and row.measured.method == "ranks/kernel_span"
        assert len({p.gpu for p in row.ranks.per_rank}) == 2
        assert row.latency_us >= row.ranks.latency_us_min > 0
        for line in row.ranks.per_rank:            # the call is the NCCL kernel
            assert line.busy_us is not None and 0 < line.collective_us <= line.busy_us <= line.latency_us * 1.001
    assert reduce.ranks.collectives == ["all_reduce (nccl)"]
    r = reduce.rates                               # 32 MiB of bf16; all_reduce's bus factor at W=2 is 1
    assert r.collective_bytes == 2 << 24 and r.busbw_gbps == pytest.approx(r.algbw_gbps, rel=1e-12) > 0
    assert gather.rates.busbw_gbps == pytest.approx(gather.rates.algbw_gbps / 2, rel=1e-12)
