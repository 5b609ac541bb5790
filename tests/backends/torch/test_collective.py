"""The torch collective on the CPU for real: one rank on the worker's own gloo group, and W=2 over two
gloo worker processes through the multi-rank path (run_testlist, as tests/run/test_ranks.py drives it)."""

from __future__ import annotations

import json
import warnings

import pytest

from operatorx.backends import get_backend
from operatorx.measure import TimingSettings
from operatorx.run import RunConfig, run_testlist
from operatorx.spec import Case

FAST = TimingSettings(warmup_calls=1, warmup_floor_s=0, first_warmup_floor_s=0, min_samples=3, max_samples=6,
                      max_time_s=0)
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def coll(kind: str, elements: int = 256, dtype: str = "bf16", tp: int = 1) -> dict:
    args: dict = {"kind": kind, "elements": elements, "dtype": dtype}
    if tp > 1:
        args["parallel"] = {"tp": tp}
    return {"type": "collective", "args": args, "sources": []}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)       # torch's renamed collectives
        yield


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["bf16", "fp32", "int8"])
def test_one_rank_runs_on_a_group_of_the_worker_alone_and_checks_exactly(kind, dtype):
    case = Case.model_validate(coll(kind, dtype=dtype))
    backend = get_backend("torch", "collective")
    assert backend.supports(case, "cpu") is None
    prepared = backend.prepare(case, "cpu")
    check = prepared.check()
    assert check.ok and check.rel_error == 0.0 and check.bound == 0.0 and check.rows_checked == 256
    assert check.reference.endswith("0 of 256 elements differ")
    out = prepared.fn()
    assert out.numel() == 256                                # W=1: every shard is the whole buffer
    assert prepared.metadata["group"] == "gloo, one rank: this worker alone"


def test_the_check_fails_when_the_collective_gives_the_wrong_result(monkeypatch):
    import operatorx.backends.torch.collective as collective

    def zeros(out, inp, group=None):
        out.zero_()

    monkeypatch.setattr(collective, "gather_function", lambda: (zeros, "planted"))
    prepared = get_backend("torch", "collective").prepare(Case.model_validate(coll("all_gather")), "cpu")
    check = prepared.check()
    assert not check.ok and check.rel_error == pytest.approx(1.0)
    assert int(check.reference.split("; ")[-1].split()[0]) > 200       # most of 256 seeded values are not 0


def test_gloo_has_no_float8_and_vllm_has_no_collective_yet():
    fp8 = Case.model_validate(coll("all_gather", dtype="e4m3", tp=2))
    torch_backend, vllm_backend = get_backend("torch", "collective"), get_backend("vllm", "collective")
    assert torch_backend.supports_ranks(fp8, "cpu", 2) == (
        "dtype=e4m3: gloo (the CPU device's process group) has no float8 types (torch's gloo refuses them: "
        "Invalid scalar type)")
    assert torch_backend.supports_ranks(fp8, "cuda", 2) is None
    from operatorx.backends.ranked import RankedBackend
    from operatorx.backends.vllm.collective import NOT_BUILT

    assert isinstance(vllm_backend, RankedBackend)
    assert vllm_backend.supports(fp8, "cuda") == vllm_backend.supports_ranks(fp8, "cuda", 2) == NOT_BUILT
    assert "not built" in NOT_BUILT


def test_all_reduce_and_all_gather_over_two_gloo_ranks_are_ok_checked_and_rated(tmp_path):
    path = tmp_path / "list.json"
    path.write_text(json.dumps([coll("all_reduce", tp=2), coll("all_gather", tp=2), coll("all_gather", dtype="e5m2",
                                                                                         tp=2)]))
    outcome = run_testlist(RunConfig(testlist=str(path), device="cpu", db=str(tmp_path / "ox.db"),
                                     results_dir=tmp_path / "res", timing=FAST, workers=2))
    reduce, gather, fp8 = outcome.rows
    for row, call in ((reduce, "all_reduce (gloo)"), (gather, "all_gather_single (gloo)")):
        assert row.status == "ok", row.message
        assert row.check is not None and row.check.ok and row.check.rel_error == 0.0 == row.check.bound
        assert row.check.rows_checked == 2 * 256                                  # both ranks' outputs
        assert row.ranks is not None and row.ranks.world == 2 and row.ranks.split == "tp2"
        assert row.ranks.collectives == [call] and len(row.ranks.per_rank) == 2
        r = row.rates
        assert r.collective_bytes == 512 and r.peak is None and r.pct_peak is None
        assert r.algbw_gbps == pytest.approx(512 / row.latency_us / 1e3, rel=1e-12)
        assert r.busbw_gbps == pytest.approx(r.algbw_gbps * (1.0 if row is reduce else 0.5), rel=1e-12)
    assert reduce.rates.flops == 256 and reduce.rates.min_bytes == 4 * 512
    assert gather.rates.flops == 0 and gather.rates.min_bytes == 2 * 512
    assert gather.extra["in_elements_per_rank"] == 128 and gather.extra["out_elements_per_rank"] == 256
    assert fp8.status == "unsupported" and "gloo (the CPU device's process group) has no float8" in fp8.message
    stored = json.loads(outcome.document_path.read_text())["rows"][0]["metrics"]
    assert stored["busbw_gbps"] == pytest.approx(reduce.rates.busbw_gbps) and stored["ranks"]["world"] == 2
