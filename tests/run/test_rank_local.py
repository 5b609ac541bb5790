"""Split cases on one device: refused with the GPUs they need, or with --rank-local timed as one
rank's shard whose row says so; planned op types refused by name. No row claims another computation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from operatorx.measure import TimingSettings
from operatorx.report.compare import compare_documents
from operatorx.run import RunConfig, run_testlist
from operatorx.spec import Case, load_testlist
from operatorx.store import Store
from tests.conftest import gemm

FAST = TimingSettings(warmup_calls=1, warmup_floor_s=0, first_warmup_floor_s=0, min_samples=3, max_samples=5,
                      max_time_s=0)
UPSTREAM = Path(__file__).parents[1] / "spec" / "upstream"


def _config(tmp_path, testlist, **kw):
    kw.setdefault("executor", "inline")
    return RunConfig(testlist=str(testlist), device="cpu", db=str(tmp_path / "ox.db"),
                     results_dir=tmp_path / "res", timing=FAST, **kw)


def _split(m: int, n: int, k: int, tp: int, role: str) -> dict:
    case = gemm(m=m, n=n, k=k)
    case["args"]["parallel"] = {"tp": tp}
    case["sources"] = [f"org/model/{role}"]
    return case


def test_a_split_case_is_refused_with_the_gpus_it_needs(tmp_path, write_testlist):
    path = write_testlist([_split(2, 128, 256, 4, "mlp.down_proj"), gemm(m=2, n=64, k=64)])
    outcome = run_testlist(_config(tmp_path, path))
    split, single = outcome.rows
    assert split.status == "unsupported" and split.measured is None and split.rank_local is None
    assert split.message.startswith("needs tp·dp = 4 GPUs of one host; this run has 1")
    assert single.status == "ok"


def test_rank_local_times_the_shard_and_every_output_says_so(tmp_path, write_testlist):
    path = write_testlist([_split(2, 128, 256, 4, "mlp.down_proj"), _split(2, 128, 256, 2, "mlp.gate_up_proj")])
    outcome = run_testlist(_config(tmp_path, path, rank_local=True))
    row, col = outcome.rows
    assert row.status == col.status == "ok"
    assert row.rank_local is not None and row.rank_local.world == 4 and row.rank_local.split == "tp4"
    assert row.rank_local.shard["k"] == 64 and row.rank_local.shard["n"] == 128
    assert col.rank_local is not None and col.rank_local.shard["n"] == 64 and col.rank_local.shard["k"] == 256
    assert row.rank_local.rule.startswith("row-parallel by role mlp.down_proj: k 256 -> 64")
    assert row.rates is not None and row.rates.flops == 2 * 2 * 128 * 64      # the shard's FLOPs, not the layer's
    assert row.case.key() == Case.model_validate(json.loads(path.read_text())[0]).key()   # the case asked for
    assert row.label() == "gemm 2x128x256 tp4 [rank-local 0/4]"
    doc = json.loads(outcome.document_path.read_text())
    assert doc["rows"][0]["label"] == "gemm 2x128x256 tp4 [rank-local 0/4]"
    assert doc["rows"][0]["metrics"]["rank_local"]["shard"]["k"] == 64
    stored = Store(str(tmp_path / "ox.db")).document(outcome.run_id)
    assert stored["rows"][0]["metrics"]["rank_local"] == doc["rows"][0]["metrics"]["rank_local"]


def test_a_rank_local_row_is_never_compared_with_the_whole_case(tmp_path, write_testlist):
    path = write_testlist([_split(2, 128, 256, 2, "mlp.down_proj")])
    local = run_testlist(_config(tmp_path, path, rank_local=True))
    refused = run_testlist(_config(tmp_path, path))
    docs = [json.loads(o.document_path.read_text()) for o in (local, refused)]
    cmp = compare_documents(*docs)
    assert len(cmp.cases) == 2 and all(c.verdict == "missing" for c in cmp.cases)
    assert {c.label for c in cmp.cases} == {"gemm 2x128x256 tp2 [rank-local 0/2]", "gemm 2x128x256 tp2"}


@pytest.mark.parametrize("name", ["gemm_parallel", "moe_parallel", "smoke_parallel"])
def test_no_upstream_parallel_case_reads_ok_on_one_device_without_rank_local(tmp_path, name):
    outcome = run_testlist(_config(tmp_path, UPSTREAM / f"{name}.json", cpu_max_gflop=1e9))
    cases = load_testlist(UPSTREAM / f"{name}.json")
    assert len(outcome.rows) == len(cases) and {r.status for r in outcome.rows} == {"unsupported"}
    for row in outcome.rows:
        want = (f"op type {row.case.type} is not implemented yet" if not row.case.implemented
                else f"needs tp·dp = {row.case.world} GPUs of one host")
        assert row.message is not None and row.message.startswith(want), row.message


def test_with_rank_local_each_upstream_gemm_is_its_shard_or_says_why_not(tmp_path):
    outcome = run_testlist(_config(tmp_path, UPSTREAM / "gemm_parallel.json", rank_local=True, cpu_max_gflop=1e-9))
    for row in outcome.rows:
        # a CPU cannot take these shapes: each row is refused for its size, after its shard was cut
        assert row.status == "unsupported" and row.message is not None
        assert row.rank_local is not None or "rank-local" in row.message, row.message
        if row.rank_local is not None:
            assert row.rank_local.split == f"tp{row.case.world}" and "GFLOP" in row.message
