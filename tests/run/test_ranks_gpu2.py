"""Multi-rank rows over two GPUs of one host (issue 34): a tp=2 GEMM and a tp=2·ep=2 MoE through
`run_testlist`, torch and vllm backends, each row with its skew and every rank's line (its own GPU,
latency, kernel times, telemetry). Skipped without two CUDA GPUs (and the vllm ones without vLLM)."""

from __future__ import annotations

import pytest

from operatorx.measure import TimingSettings
from operatorx.run import RunConfig, run_testlist
from tests.conftest import BF16, gemm, moe

TIMING = TimingSettings(warmup_calls=2, warmup_floor_s=0, first_warmup_floor_s=0.2, max_time_s=0.3)


def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


def _cases() -> list[dict]:
    row_gemm = gemm(m=64, n=2048, k=4096)
    row_gemm["args"]["parallel"] = {"tp": 2}
    row_gemm["sources"] = ["org/model/mlp.down_proj"]          # row-parallel: K split, [M, N] all-reduced
    ep_moe = moe(tokens=64, hidden=2048, experts={"num": 16, "top_k": 4, "inter": 1024, "w1": BF16, "w2": BF16})
    ep_moe["args"]["parallel"] = {"tp": 2, "ep": 2}            # whole experts per rank, every rank all tokens
    return [row_gemm, ep_moe]


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="needs two GPUs of one host")
@pytest.mark.parametrize("backend", ["torch", "vllm"])
def test_tp2_gemm_and_ep2_moe_rows_carry_skew_and_each_ranks_telemetry(tmp_path, write_testlist, backend):
    if backend == "vllm":
        pytest.importorskip("vllm")
    path = write_testlist(_cases())
    outcome = run_testlist(RunConfig(testlist=str(path), backend=backend, device="cuda", gpus=(0, 1),
                                     db=str(tmp_path / "ox.db"), results_dir=tmp_path / "res", timing=TIMING))
    assert [r.case.type for r in outcome.rows] == ["gemm", "moe"]
    for row in outcome.rows:
        assert row.status == "ok", (row.label(), row.message)
        ranks = row.ranks
        assert ranks is not None and ranks.world == 2 and ranks.split in ("tp2", "tp2·ep2"), ranks
        assert row.check is not None and row.check.ok and row.measured.method == "ranks/kernel_span"
        assert len(ranks.per_rank) == 2 and [line.rank for line in ranks.per_rank] == [0, 1]
        gpus = [line.gpu for line in ranks.per_rank]
        assert None not in gpus and len(set(gpus)) == 2, gpus
        # the row is the slowest rank's; skew is the median spread between the slowest and the fastest
        assert ranks.skew_us is not None and 0 <= ranks.skew_us <= row.latency_us
        assert row.latency_us >= ranks.latency_us_min > 0
        assert max(line.latency_us for line in ranks.per_rank) <= row.latency_us * 1.001
        assert ranks.iterations == len(row.samples_us) >= 10
        for line in ranks.per_rank:
            assert len(line.samples_us) == ranks.iterations
            assert line.busy_us is not None and line.collective_us is not None
            assert 0 <= line.collective_us <= line.busy_us <= line.latency_us * 1.001, line
            if backend == "torch":                 # torch.distributed's collectives are NCCL kernels; vLLM's
                assert line.collective_us > 0      # all-reduce may be its own (custom all-reduce), not NCCL's
            t = line.telemetry
            assert t is not None and t.available is True, (line.rank, t)
            assert t.readings is not None and t.readings >= 1, (line.rank, t)
            assert t.sm_clock_mhz is not None and t.sm_clock_mhz["p50"] > 0, (line.rank, t)
            assert line.capped is not None
        assert row.conditions is not None and row.conditions.telemetry is not None
