"""Multi-rank cases on CUDA (NCCL, NCCL_NVLS_ENABLE=0): the rank path with W=1 on one GPU against the
plain path (bench/rank_w1.py), and W=2 over two GPUs when the host has them. Skipped without CUDA."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from operatorx.measure import TimingSettings
from operatorx.run import RunConfig, run_testlist
from tests.conftest import gemm, moe

BENCH = Path(__file__).parents[2] / "bench" / "rank_w1.py"


def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


@pytest.mark.gpu
def test_the_rank_path_with_one_rank_reads_what_the_plain_path_reads(tmp_path):
    out = tmp_path / "w1.json"
    done = subprocess.run([sys.executable, str(BENCH), "--device", "cuda", "--rounds", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert len(rows) == 3, done.stdout
    for pair in rows:
        plain, ranked = pair["plain"], pair["rank_w1"]
        assert plain["status"] == ranked["status"] == "ok", pair["case"]
        m = ranked["metrics"]
        assert m["method"] == "ranks/kernel_span" and m["ranks"]["world"] == 1
        assert m["ranks"]["skew_us"] == 0 and m["ranks"]["barrier"].startswith("device all_reduce")
        assert m["check"]["ok"] and m["ranks"]["per_rank"][0]["gpu"] is not None
        assert m["ranks"]["kernel_times"].startswith("recorded")
        line = m["ranks"]["per_rank"][0]
        assert line["collective_us"] == 0          # one rank: the call holds no NCCL kernel
        # both paths read the same call's kernel span and busy time from the same records: the same
        # numbers within run-to-run noise (docs/benchmarks.md has the measured agreement)
        p, r = plain["metrics"]["latency_us"], m["latency_us"]
        assert abs(r - p) <= max(0.05 * p, 0.5), (pair["case"], p, r)
        pb, rb = plain["metrics"]["busy_us"], line["busy_us"]
        assert abs(rb - pb) <= max(0.05 * pb, 0.5) and m["busy_us"] == rb, (pair["case"], pb, rb)


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="needs two GPUs of one host")
def test_tp2_gemm_and_tp2_and_dp2_ep2_moe_over_two_gpus(tmp_path, write_testlist):
    def split(case: dict, parallel: dict, role: str = "") -> dict:
        case["args"]["parallel"] = parallel
        if role:
            case["sources"] = [f"org/model/{role}"]
        return case

    bf16 = {"dtype": "bf16"}
    path = write_testlist([split(gemm(m=64, n=4096, k=2048), {"tp": 2}, "mlp.gate_up_proj"),
                           split(gemm(m=64, n=2048, k=4096), {"tp": 2}, "mlp.down_proj"),
                           split(moe(tokens=64, hidden=2048, experts={"num": 16, "top_k": 4, "inter": 1024,
                                                                      "w1": bf16, "w2": bf16}), {"tp": 2}),
                           split(moe(tokens=64, hidden=2048, experts={"num": 16, "top_k": 4, "inter": 1024,
                                                                      "w1": bf16, "w2": bf16}), {"dp": 2, "ep": 2})])
    timing = TimingSettings(warmup_calls=2, warmup_floor_s=0, first_warmup_floor_s=0.2, max_time_s=0.3)
    outcome = run_testlist(RunConfig(testlist=str(path), device="cuda", gpus=(0, 1), db=str(tmp_path / "ox.db"),
                                     results_dir=tmp_path / "res", timing=timing))
    for row in outcome.rows:
        assert row.status == "ok", row.message
        assert row.check.ok and row.ranks.world == 2 and row.measured.method == "ranks/kernel_span"
        assert len({p.gpu for p in row.ranks.per_rank}) == 2
        assert row.latency_us >= row.ranks.latency_us_min > 0
        for line in row.ranks.per_rank:            # every split here exchanges data inside the call
            assert line.busy_us is not None and line.collective_us is not None
            assert 0 < line.collective_us <= line.busy_us <= line.latency_us * 1.001, line
