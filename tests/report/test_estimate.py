"""report/estimate.py: a planted run and a small scenario, every number hand-computed."""

from __future__ import annotations

from typing import Any

import pytest

from operatorx.report.estimate import EstimateError, estimate
from operatorx.result import Row
from operatorx.spec import Case
from tests.report.rows import make_row

SCENARIO = {"model": "org/m", "scheme": "bf16", "isl": 1024, "osl": 128, "conc": 8, "tp": 2, "dp": 1, "ep": 1,
            "mtp": 1, "chunk": 8192}
BF16 = {"dtype": "bf16"}


def gemm(m: int, n: int, roles: list[str], count: int, step: str = "decode") -> Case:
    return Case.model_validate({"type": "gemm", "args": {"m": m, "n": n, "k": 64, "a": BF16, "b": BF16, "out": "bf16"},
                                "sources": [f"org/m/{r}" for r in roles], "count": count, "step": step,
                                "metadata": {"scenario": SCENARIO}})


def attention(count: int, step: str = "decode", role: str = "self_attn", **extra: Any) -> Case:
    proj = {"a": BF16, "b": BF16}
    args = {"hidden": 2048, "batch": {"groups": [{"count": 8, "q": 2, "ctx": 1088}]},
            "proj": {"q_proj": proj, "k_proj": proj, "v_proj": proj, "o_proj": proj}, "q_heads": 32, "kv_heads": 4,
            "head_dim": 128, "rope_dim": 128, "rope_theta": 1000000.0, "qk_norm": True, "parallel": {"tp": 2}, **extra}
    return Case.model_validate({"type": "gqa", "args": args, "sources": [f"org/m/{role}"], "count": count,
                                "step": step, "metadata": {"scenario": SCENARIO}})


def collective(count: int, step: str = "decode") -> Case:
    return Case.model_validate({"type": "collective", "args": {"kind": "all_reduce", "elements": 8192, "dtype": "bf16",
                                                                "parallel": {"tp": 2}},
                                "sources": ["org/m/self_attn:all_reduce", "org/m/mlp:all_reduce"], "count": count,
                                "step": step, "metadata": {"scenario": SCENARIO}})


QKV = gemm(16, 768, ["self_attn.qkv_proj"], 4)
KV_AND_DOWN = gemm(16, 128, ["self_attn.o_proj", "mlp.down_proj"], 4 + 4)   # one key over two modules' roles
UP = gemm(16, 1024, ["mlp.gate_up_proj"], 4)
HEAD = gemm(16, 4096, ["lm_head"], 1)
ATTN = attention(4)
AR = collective(8)


def rows(latency_us: dict[Case, float], others: dict[Case, tuple[str, str]]) -> list[Row]:
    out = [make_row(case=c, index=i, latency_us=v, samples_us=[v]) for i, (c, v) in enumerate(latency_us.items())]
    out += [make_row(s, message=m, case=c, index=len(out) + i) for i, (c, (s, m)) in enumerate(others.items())]
    return out


def run(cases: list[Case], planted: list[Row]) -> Any:
    return estimate(cases, planted, run="r1", file="s.json")


def test_gemm_roles_used_when_attention_has_no_ok_row():
    cases = [QKV, KV_AND_DOWN, UP, HEAD, ATTN, AR]
    planted = rows({QKV: 3.0, KV_AND_DOWN: 1.5, UP: 4.0, AR: 2.5},
                   {ATTN: ("unsupported", "no gqa kernel here")})       # HEAD: not in the run
    step = run(cases, planted).steps[0]
    # 4*3 + 8*1.5 + 4*4 + 8*2.5 = 12 + 12 + 16 + 20
    assert step.time_us == 60.0
    assert step.attention[0].used == "gemm roles" and step.attention[0].module == "self_attn"
    assert {s.name: s.time_us for s in step.by_class} == {"gemm": 40.0, "collective": 20.0}
    assert {s.name: s.time_us for s in step.by_role} == {
        "self_attn.qkv_proj": 12.0, "self_attn.o_proj + mlp.down_proj": 12.0, "mlp.gate_up_proj": 16.0,
        "self_attn:all_reduce + mlp:all_reduce": 20.0}
    assert sum(s.share for s in step.by_class) == pytest.approx(1.0)
    assert sum(s.share for s in step.by_role) == pytest.approx(1.0)
    missing = {u.label: (u.status, u.reason, u.count) for u in step.unmeasured}
    assert missing == {ATTN.label(): ("unsupported", "no gqa kernel here", 4), HEAD.label(): ("not in run", None, 1)}
    assert (step.ops, step.ops_measured, step.counts, step.counts_measured) == (6, 4, 29, 24)
    assert step.coverage_line() == "4 of 6 ops measured, 82.8% of counts"
    # decode: conc/dp x (1 + mtp) = 8 x 2 = 16 tokens per dp rank; lm_head is not in the run, so no
    # rate: one over part of the step would read too fast
    assert step.tokens is not None and step.tokens.tokens_per_dp_rank == 16
    assert step.tokens.tokens_per_s_per_gpu is None and "not given" in step.tokens.rule
    # lm_head measured (2 µs x 1), the attention still unsupported: its GEMM roles time the projections,
    # not the attention over the cache, so the step is still not whole
    partial = run(cases, rows({QKV: 3.0, KV_AND_DOWN: 1.5, UP: 4.0, AR: 2.5, HEAD: 2.0},
                              {ATTN: ("unsupported", "no gqa kernel here")})).steps[0]
    assert partial.time_us == 62.0 and [u.op_class for u in partial.unmeasured] == ["attention"]
    assert partial.tokens is not None and partial.tokens.tokens_per_s_per_gpu is None


def test_attention_case_used_when_ok_and_its_gemm_roles_left_out():
    cases = [QKV, KV_AND_DOWN, UP, ATTN, AR]
    planted = rows({QKV: 3.0, KV_AND_DOWN: 1.5, UP: 4.0, ATTN: 10.0, AR: 2.5}, {})
    step = run(cases, planted).steps[0]
    # attention 4*10; qkv inside it; o_proj's 4 of the merged 8 inside it, down_proj's 4*1.5 kept
    assert step.time_us == 40.0 + 6.0 + 16.0 + 20.0
    assert step.attention[0].used == "attention case"
    assert {s.name: s.time_us for s in step.by_role} == {"self_attn": 40.0, "mlp.down_proj": 6.0,
                                                          "mlp.gate_up_proj": 16.0,
                                                          "self_attn:all_reduce + mlp:all_reduce": 20.0}
    assert {s.name: s.time_us for s in step.by_class} == {"attention": 40.0, "gemm": 22.0, "collective": 20.0}
    assert sum(s.share for s in step.by_role) == pytest.approx(1.0)
    assert step.unmeasured == [] and step.ops_in_attention == 1
    assert step.coverage_line() == "5 of 5 ops measured (1 inside an attention case), 100.0% of counts"
    # every op measured: the rate (decode, 16 tokens per dp rank over tp = 2 GPUs) in 82 µs
    assert step.tokens is not None and step.tokens.tokens_per_s_per_gpu == pytest.approx(16 / 2 / 82e-6)


def test_steps_are_apart_and_the_same_op_counts_in_each():
    prefill_up = gemm(16, 1024, ["mlp.gate_up_proj"], 3, step="prefill")   # same key as UP, the other step
    planted = rows({UP: 4.0}, {})
    est = run([UP, prefill_up], planted)
    assert [(s.step, s.time_us) for s in est.steps] == [("decode", 16.0), ("prefill", 12.0)]
    # prefill: isl 1024 fits the 8192 chunk: min(8, 8) whole prompts = 8192 tokens
    assert est.steps[1].tokens is not None and est.steps[1].tokens.tokens_per_dp_rank == 8192


def test_error_and_missing_rows_are_listed_with_their_status():
    planted = rows({}, {UP: ("error", "RuntimeError: boom"), HEAD: ("missing", None)})
    step = run([UP, HEAD], planted).steps[0]
    assert step.time_us == 0.0 and step.tokens is not None and step.tokens.tokens_per_s_per_gpu is None
    assert [(u.status, u.reason, u.count) for u in step.unmeasured] == [("error", "RuntimeError: boom", 4),
                                                                          ("missing", None, 1)]


def test_a_case_without_count_is_refused_naming_it():
    plain_case = Case.model_validate({"type": "gemm", "args": {"m": 1, "n": 2, "k": 3, "a": BF16, "b": BF16,
                                                                "out": "bf16"}})
    with pytest.raises(EstimateError, match=r"s\.json: case 1: no `count`"):
        run([UP, plain_case], [])


def test_two_rows_of_one_case_are_refused():
    planted = [make_row(case=UP, index=0), make_row(case=UP, index=1, side="B")]
    with pytest.raises(EstimateError, match="several rows"):
        run([UP], planted)


def test_a_layer_kinds_attention_case_stands_for_its_own_layers_projections():
    """Full and sliding-window layers share their GEMM cases (one count over both kinds); each kind's ok
    attention case replaces its own layers' part of them, and the two together all of it."""
    qkv, o = gemm(16, 768, ["self_attn.qkv_proj"], 6), gemm(16, 128, ["self_attn.o_proj"], 6)
    full, sliding = attention(4), attention(2, role="self_attn:sliding", window=128)
    both = run([qkv, o, full, sliding], rows({qkv: 3.0, o: 1.0, full: 10.0, sliding: 5.0}, {})).steps[0]
    assert both.time_us == 4 * 10.0 + 2 * 5.0                  # no projection counted twice
    assert both.ops_in_attention == 2
    only_sliding = run([qkv, o, full, sliding],
                       rows({qkv: 3.0, o: 1.0, sliding: 5.0}, {full: ("unsupported", "no kernel")})).steps[0]
    # the full layers' 4 of each GEMM's 6 stay as GEMMs: 4*3 + 4*1, beside the sliding case's 2*5
    assert only_sliding.time_us == 12.0 + 4.0 + 10.0
