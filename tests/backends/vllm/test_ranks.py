"""The vllm backends over ranks (backends/vllm/ranks.py): what they refuse before building anything,
and on the H200 the rank path at W=1 against the plain path (bench/rank_w1.py --backend vllm)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from operatorx.backends.ranked import RankedBackend
from operatorx.backends.vllm.gemm import VllmGemm
from operatorx.backends.vllm.moe import VllmMoe
from operatorx.backends.vllm.ranks import gemm_rank_refusal, linear_split, moe_rank_refusal
from operatorx.spec import Case
from tests.conftest import gemm, moe

BENCH = Path(__file__).parents[3] / "bench" / "rank_w1.py"


def _case(raw: dict, parallel: dict | None = None, role: str | None = None) -> Case:
    if parallel:
        raw["args"]["parallel"] = parallel
    if role:
        raw["sources"] = [f"org/model/{role}"]
    return Case.model_validate(raw)


def test_both_vllm_backends_run_multi_rank_cases():
    assert isinstance(VllmGemm(), RankedBackend) and isinstance(VllmMoe(), RankedBackend)


def test_the_gemm_split_is_the_roles_and_unbuilt_ones_are_named():
    assert linear_split(_case(gemm(m=8, n=256, k=256), {"tp": 2}, "mlp.gate_up_proj"))[0] == "column"
    assert linear_split(_case(gemm(m=8, n=256, k=256), {"tp": 2}, "self_attn.o_proj"))[0] == "row"
    assert linear_split(_case(gemm(m=8, n=256, k=256), {"tp": 2}, "mlp.gate"))[0] == "replicated"
    assert linear_split(_case(gemm(m=8, n=256, k=256)))[0] == "replicated"     # one rank, no role
    why = gemm_rank_refusal(_case(gemm(m=8, n=256, k=256), {"tp": 2}, "lm_head"), 2)
    assert why is not None and "vocab-parallel" in why
    assert "no sources" in (gemm_rank_refusal(_case(gemm(m=8, n=256, k=256), {"tp": 2}), 2) or "")


def test_dp_moe_and_packed_experts_over_ranks_are_refused_with_what_is_missing():
    dp = _case(moe(tokens=8, hidden=256), {"dp": 2, "ep": 2})
    why = moe_rank_refusal(dp, "bf16", 2)
    assert why is not None and why.startswith("dp=2") and "dp metadata" in why
    tp = _case(moe(tokens=8, hidden=256), {"tp": 2})
    assert moe_rank_refusal(tp, "bf16", 2) is None and moe_rank_refusal(tp, "fp8_block", 2) is None
    packed = moe_rank_refusal(tp, "mxfp4_w4a16", 2)
    assert packed is not None and "mxfp4_w4a16 experts over 2 ranks" in packed
    assert moe_rank_refusal(_case(moe(tokens=8, hidden=256)), "mxfp4_w4a16", 1) is None


@pytest.mark.gpu
def test_the_vllm_rank_path_with_one_rank_reads_what_the_plain_path_reads(tmp_path):
    pytest.importorskip("vllm")
    out = tmp_path / "w1.json"
    done = subprocess.run([sys.executable, str(BENCH), "--device", "cuda", "--backend", "vllm", "--rounds", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert len(rows) == 6, done.stdout
    layers = set()
    for pair in rows:
        plain, ranked = pair["plain"], pair["rank_w1"]
        assert plain["status"] == ranked["status"] == "ok", pair["case"]
        m = ranked["metrics"]
        assert m["method"] == "ranks/kernel_span" and m["ranks"]["world"] == 1 and m["check"]["ok"]
        facts = m["backend_meta"]["rank_layer"]
        assert facts["world"] == 1 and facts["rank"] == 0
        layers.add(facts.get("class") or m["backend_meta"]["layer"])
        p, r = plain["metrics"]["latency_us"], m["latency_us"]
        assert abs(r - p) <= max(0.05 * p, 0.5), (pair["case"], p, r)
    assert {"vllm.model_executor.layers.linear.RowParallelLinear",
            "vllm.model_executor.layers.linear.ColumnParallelLinear"} <= layers
