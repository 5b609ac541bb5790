"""The torch gqa and mla backends on the CPU: decode and prefill groups checked against the fp32
reference, a wrong module caught by the check, refusals by field, and whole runs of attention lists."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from operatorx.backends.torch.attention import TorchGqa, TorchMla, backend, core
from operatorx.backends.torch.attention.layout import plan_layout
from operatorx.backends.torch.attention.rope import rope_table
from operatorx.measure import TimingSettings
from operatorx.run import RunConfig, run_testlist
from operatorx.spec import Case
from operatorx.spec.attention import KdaArgs

UPSTREAM = Path(__file__).parents[2] / "spec" / "upstream"
FAST = TimingSettings(warmup_calls=1, warmup_floor_s=0, first_warmup_floor_s=0, min_samples=3, max_samples=5,
                      max_time_s=0)
GQA = {"hidden": 256, "q_heads": 8, "kv_heads": 2, "head_dim": 32, "rope_dim": 32, "rope_theta": 10000.0}
MLA = {"hidden": 256, "heads": 4, "q_lora_rank": 64, "kv_lora_rank": 64, "nope": 32, "rope_dim": 16, "v": 32,
       "rope_theta": 10000.0}
YARN = {"type": "yarn", "factor": 40, "original_max": 4096, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
        "mscale_all_dim": 1.0}
FP8_BLOCK = {"a": {"dtype": "e4m3", "scale": {"dtype": "fp32", "group": [1, 128], "static": False}},
             "b": {"dtype": "e4m3", "scale": {"dtype": "fp32", "group": [128, 128], "static": True}}}
DECODE = [{"count": 4, "q": 1, "ctx": 100}]
PREFILL = [{"count": 2, "q": 70, "ctx": 0}, {"count": 1, "q": 33, "ctx": 50}]
MIXED = [{"count": 3, "q": 1, "ctx": {"dist": "uniform", "min": 10, "max": 90}}, {"count": 1, "q": 40, "ctx": 30}]


def _case(op: str, groups: list[dict[str, Any]], pages: str = "contiguous", **extra: Any) -> Case:
    base = GQA if op == "gqa" else MLA
    args = {**base, **extra, "batch": {"groups": groups, "pages": pages, "seed": 3}}
    return Case.model_validate({"type": op, "args": args, "sources": ["org/model/self_attn"]})


def _backend(case: Case) -> Any:
    return TorchGqa() if case.type == "gqa" else TorchMla()


def _prepared(case: Case) -> Any:
    b = _backend(case)
    assert b.supports(case, "cpu") is None
    return b.prepare(case, "cpu")


@pytest.mark.parametrize("groups", [DECODE, PREFILL, MIXED], ids=["decode", "prefill", "mixed"])
@pytest.mark.parametrize("extra", [{}, {"qk_norm": True, "gate": True, "rope_dim": 16}, {"window": 20}],
                         ids=["plain", "norm-gate-partial-rope", "window"])
def test_gqa_matches_its_fp32_reference(groups, extra):
    p = _prepared(_case("gqa", groups, pages="shuffled", **extra))
    check = p.check()
    assert check.ok and check.rel_error < 1e-2, check
    requests = sum(g["count"] for g in groups)
    rows_of = {1: 1, 70: 64, 33: 33, 40: 40}
    first_last = sum(min(2, g["count"]) * rows_of[g["q"]] for g in groups)
    assert check.rows_checked == first_last
    decode = sum(g["count"] for g in groups if g["q"] == 1)
    assert p.metadata["requests"] == {"decode": decode, "prefill": requests - decode}
    tokens = sum(g["count"] * g["q"] for g in groups)
    assert tuple(p.fn().shape) == (tokens, GQA["hidden"])


@pytest.mark.parametrize("groups", [DECODE, PREFILL, MIXED], ids=["decode", "prefill", "mixed"])
@pytest.mark.parametrize("extra", [{}, {"rope_scaling": YARN}, {"rope": False, "rope_theta": None}],
                         ids=["rope", "yarn", "no-rope"])
def test_mla_matches_its_absorbed_fp32_reference(groups, extra):
    extra = {k: v for k, v in extra.items() if v is not None}
    if extra.get("rope") is False:
        args = {k: v for k, v in MLA.items() if k != "rope_theta"}
        case = Case.model_validate({"type": "mla", "args": {**args, "rope": False, "batch": {"groups": groups}},
                                    "sources": ["x"]})
    else:
        case = _case("mla", groups, **extra)
    check = _prepared(case).check()
    assert check.ok and check.rel_error < 1e-2, check
    assert "absorbed" in check.reference


def test_new_keys_written_to_the_wrong_slots_fail_the_check():
    p = _prepared(_case("gqa", MIXED))
    module = p.fn.__closure__[0].cell_contents["module"]   # the state the timed call reads
    module.write_slots = module.write_slots.roll(1)
    check = p.check()
    assert not check.ok and check.rel_error > 0.05


def test_rope_at_the_wrong_positions_fails_the_check():
    case = _case("mla", DECODE)
    p = _prepared(case)
    module = p.fn.__closure__[0].cell_contents["module"]
    wrong = torch.full((4,), 7, dtype=torch.int64)
    module.rope = rope_table(wrong, MLA["rope_dim"], MLA["rope_theta"], None, "interleaved", torch.bfloat16, "cpu")
    check = p.check()
    assert not check.ok and check.rel_error > 0.05


def test_chunks_under_a_small_gather_budget_give_the_same_output(monkeypatch):
    case = _case("gqa", MIXED, pages="shuffled")
    whole = _prepared(case)
    monkeypatch.setattr(core, "GATHER_BUDGET_BYTES", 1)          # every request a chunk of its own
    monkeypatch.setattr(backend, "GATHER_BUDGET_BYTES", 1)
    split = _prepared(case)
    assert (whole.metadata["sdpa_calls"], split.metadata["sdpa_calls"]) == (2, 4)
    torch.testing.assert_close(whole.fn(), split.fn(), rtol=0, atol=2e-2)
    assert split.check().ok


def test_a_ctx_range_draws_the_same_contexts_from_the_seed():
    case = _case("gqa", MIXED)
    batch = case.args.batch
    first, again = plan_layout(batch), plan_layout(batch)
    ctx = [r.ctx for r in first.requests]
    assert ctx == [r.ctx for r in again.requests] and all(10 <= c <= 90 for c in ctx[:3]) and ctx[3] == 30
    other = plan_layout(batch.model_copy(update={"seed": 4}))
    assert [r.ctx for r in other.requests] != ctx


@pytest.mark.parametrize(("op", "extra", "field"), [
    ("gqa", {"kv_cache_dtype": "fp8"}, "kv_cache_dtype=fp8"),
    ("gqa", {"proj": {"q_proj": FP8_BLOCK}}, "proj: q_proj=fp8_block, k_proj=bf16"),
    ("gqa", {"proj": {n: FP8_BLOCK for n in ("q_proj", "k_proj", "v_proj", "o_proj")}},
     "proj: block FP8 projections run through F.scaled_mm (cuBLASLt) on CUDA, not on cpu"),
    ("gqa", {"proj": {"q_proj": {"a": FP8_BLOCK["a"], "b": FP8_BLOCK["a"]}}}, "proj.q_proj: e4m3/fp32:1x128:dyn x"),
    ("gqa", {"parallel": {"tp": 2}}, "parallel tp2"),
    ("mla", {"gate": True}, "gate"),
])
def test_what_the_torch_backend_cannot_run_is_refused_by_field(op, extra, field):
    case = _case(op, DECODE, **extra)
    why = _backend(case).supports(case, "cpu")
    assert why is not None and why.startswith(field), why


def _config(tmp_path: Path, testlist: Path, **kw: Any) -> RunConfig:
    return RunConfig(testlist=str(testlist), device="cpu", db=str(tmp_path / "ox.db"), results_dir=tmp_path / "res",
                     timing=FAST, executor="inline", **kw)


def test_a_run_times_gqa_and_mla_rows_with_their_checks(tmp_path, write_testlist):
    cases = [_case("gqa", MIXED, qk_norm=True).to_json(), _case("mla", PREFILL).to_json()]
    outcome = run_testlist(_config(tmp_path, write_testlist(cases)))
    assert [r.status for r in outcome.rows] == ["ok", "ok"]
    for row, case in zip(outcome.rows, cases, strict=True):
        assert row.check is not None and row.check.ok and row.measured is not None
        assert row.case.flops() == Case.model_validate(case).flops()


def test_a_torch_run_reads_gdn_and_kda_rows_as_unsupported_with_the_reason(tmp_path, write_testlist):
    batch = {"groups": [{"count": 2, "q": 1, "ctx": 8}]}
    cases = [{"type": "gdn", "args": {"hidden": 32, "qk_heads": 1, "v_heads": 2, "head_dim": 8, "conv_kernel": 4,
                                      "batch": batch}},
             {"type": "kda", "args": {"hidden": 32, "heads": 2, "head_dim": 8, "conv_kernel": 4, "batch": batch}}]
    outcome = run_testlist(_config(tmp_path, write_testlist(cases)))
    # gdn runs through vllm only; kda through no backend yet
    want = [("unsupported", "backend 'torch' has no gdn op"),
            ("unsupported", f"op type kda is not implemented yet: {KdaArgs.MISSING}")]
    assert [(r.status, r.message) for r in outcome.rows] == want


def test_upstream_attention_rank_local_rows_are_shards_or_say_what_is_missing(tmp_path):
    raw = json.loads((UPSTREAM / "attn_parallel.json").read_text())
    picked = [c for c in raw if c["type"] in ("gqa", "mla")] + [next(c for c in raw if c["type"] == "kda")]
    bf16 = copy.deepcopy(next(c for c in picked if c["type"] == "gqa"))
    bf16["args"].pop("proj")
    bf16["args"]["kv_cache_dtype"] = "auto"
    bf16["args"]["batch"] = {"groups": [{"count": 2, "q": 1, "ctx": 64}]}
    path = tmp_path / "attn.json"
    path.write_text(json.dumps([*picked, bf16]))
    outcome = run_testlist(_config(tmp_path, path, rank_local=True, cpu_max_gflop=1e9, cpu_max_gb=1e9))
    by_type: dict[str, list[Any]] = {}
    for row in outcome.rows:
        by_type.setdefault(row.case.type, []).append(row)
    assert {r.status for r in outcome.rows[:-1]} == {"unsupported"}
    for row in by_type["gqa"][:-1]:
        assert row.rank_local is not None and row.message is not None and row.message.startswith("proj.")
    for row in by_type["mla"]:
        dcp = row.case.parallel is not None and row.case.parallel.dcp > 1
        assert row.message is not None
        assert row.message.startswith("--rank-local: no shard of this case: dcp=8") if dcp else (
            row.message.startswith("kv_cache_dtype=fp8") and row.rank_local is not None)
    assert by_type["kda"][0].message == f"op type kda is not implemented yet: {KdaArgs.MISSING}"
    last = outcome.rows[-1]
    assert last.status == "ok" and last.rank_local is not None and last.check is not None and last.check.ok
    assert last.rank_local.shard["q_heads"] == 64 // last.case.world


def _reference_inputs(case: Case) -> tuple[Any, Any, torch.Tensor, Any]:
    from operatorx.backends.torch.attention.gqa import gqa_weights
    from operatorx.backends.torch.attention.mla import mla_weights

    args = case.args
    gen = torch.Generator().manual_seed(7)
    weights = gqa_weights(args, gen, "cpu") if case.type == "gqa" else mla_weights(args, gen, "cpu")
    layout = plan_layout(args.batch)
    x = torch.randn(layout.tokens, args.hidden, generator=gen)
    return args, weights, x, layout


def test_the_reference_quantizes_each_projection_input_it_is_told_to():
    """`act` sees the module input of every reference request, then each attention output before o_proj."""
    from operatorx.backends.torch.attention.reference import gqa_reference, reference_requests

    args, w, x, layout = _reference_inputs(_case("gqa", MIXED))
    gen = torch.Generator().manual_seed(8)
    kv = {r.row0: (torch.randn(r.ctx, args.kv_heads, args.head_dim, generator=gen),) * 2 for r in layout.requests}
    seen: list[tuple[int, ...]] = []

    def spy(t: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(t.shape))
        return t.float()

    plain = gqa_reference(args, w, x, layout, lambda r: kv[r.row0])
    spied = gqa_reference(args, w, x, layout, lambda r: kv[r.row0], act=spy)
    assert torch.equal(plain.out, spied.out)
    want = []
    for r in reference_requests(layout):
        want += [(r.q, args.hidden), (min(r.q, 64), args.q_heads * args.head_dim)]
    assert seen == want
    rounded = gqa_reference(args, w, x, layout, lambda r: kv[r.row0], act=lambda t: t.to(torch.bfloat16).float())
    rel = float((rounded.out - plain.out).norm() / plain.out.norm())
    assert 1e-4 < rel < 1e-2, rel


def test_the_mla_reference_quantizes_latents_only_for_the_requests_named():
    from operatorx.backends.torch.attention.reference import mla_reference, reference_requests

    args, w, x, layout = _reference_inputs(_case("mla", MIXED))
    gen = torch.Generator().manual_seed(9)
    cache = {r.row0: torch.randn(r.ctx, args.kv_lora_rank + args.rope_dim, generator=gen) for r in layout.requests}
    seen: list[tuple[int, ...]] = []

    def spy(t: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(t.shape))
        return t.float()

    mla_reference(args, w, x, layout, lambda r: cache[r.row0], act=spy, latent_quantized=lambda r: r.q > 1)
    want = []
    for r in reference_requests(layout):
        want += [(r.q, args.hidden), (r.q, args.q_lora_rank)]
        if r.q > 1:                                           # kv_b_proj over every latent it attends
            want.append((r.ctx + r.q, args.kv_lora_rank))
        want.append((min(r.q, 64), args.heads * args.v))
    assert seen == want
