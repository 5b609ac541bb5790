from __future__ import annotations

import pytest
from pydantic import ValidationError

from operatorx.spec import Case, merge_cases
from tests.conftest import fp8_block, gemm, moe


def test_equality_ignores_sources():
    a = Case.model_validate({**gemm(), "sources": ["x/y/q_proj"]})
    b = Case.model_validate({**gemm(), "sources": ["z/w/o_proj"]})
    assert a == b and hash(a) == hash(b)
    assert a != Case.model_validate(gemm(m=8))


def test_defaults_and_explicit_values_are_the_same_case():
    explicit = gemm()
    implicit = gemm()
    del implicit["args"]["out"]
    assert Case.model_validate(explicit) == Case.model_validate(implicit)


def test_old_form_sources_with_parallel_names():
    c = Case.model_validate({**gemm(), "sources": ["org/m1", "org/m2"], "name": ["q_proj", "o_proj"]})
    assert c.sources == ["org/m1/q_proj", "org/m2/o_proj"]


def test_old_form_length_mismatch_is_refused():
    with pytest.raises(ValidationError, match="one role per source, or a single role for all"):
        Case.model_validate({**gemm(), "sources": ["org/m1", "org/m2", "org/m3"], "name": ["a", "b"]})


def test_sources_may_be_missing_or_empty():
    d = gemm()
    del d["sources"]
    assert Case.model_validate(d).sources == []


def test_merge_unions_sources_in_first_seen_order():
    a = Case.model_validate({**gemm(), "sources": ["m/a/q"]})
    b = Case.model_validate({**gemm(m=8), "sources": ["m/a/k"]})
    c = Case.model_validate({**gemm(), "sources": ["m/b/q", "m/a/q"]})
    merged = merge_cases([a, b, c])
    assert [x.args.m for x in merged] == [4, 8]
    assert merged[0].sources == ["m/a/q", "m/b/q"]


def test_gemm_flops_and_bytes():
    c = Case.model_validate(gemm(m=2, n=256, k=128))
    assert c.flops() == 2 * 2 * 256 * 128
    assert c.min_bytes() == 2 * 128 * 2 + 256 * 128 * 2 + 2 * 256 * 2


def test_fp8_block_bytes_count_scales_and_bf16_activation():
    c = Case.model_validate(fp8_block(m=4, n=256, k=256))
    a_bytes = 4 * 256 * 2                       # arrives bf16, quantized inside the op
    b_bytes = 256 * 256 + (2 * 2) * 4            # e4m3 + 2x2 fp32 block scales
    out_bytes = 4 * 256 * 2
    assert c.min_bytes() == a_bytes + b_bytes + out_bytes


def test_partial_weight_row_blocks_are_allowed():
    # DeepSeek's fused q_a + kv_a: N = 1536 + 576 = 2112 is 16.5 blocks of 128
    c = Case.model_validate(fp8_block(m=1, n=2112, k=7168))
    assert c.args.b.scale.count(2112, 7168, weight=True) == 17 * 56


def test_moe_flops_follow_the_format():
    c = Case.model_validate(moe(shared={"count": 1, "inter": 64, "w1": {"dtype": "bf16"}, "w2": {"dtype": "bf16"}}))
    t, h, e, k, i = 8, 256, 8, 2, 128
    assert c.flops() == 2 * t * h * e + 6 * t * k * h * i + 6 * t * h * 64 * 1


def test_moe_latent_flops():
    c = Case.model_validate(moe(experts={"num": 8, "top_k": 2, "inter": 128, "w1": {"dtype": "bf16"},
                                         "w2": {"dtype": "bf16"}, "latent": 128}))
    assert c.flops() == 2 * 8 * 256 * 8 + 6 * 8 * 2 * 128 * 128 + 4 * 8 * 256 * 128


def test_per_channel_weight_scale_counts_one_per_output_row():
    d = gemm(n=512, k=256)
    d["args"]["a"] = {"dtype": "e4m3", "scale": {"dtype": "fp32", "static": False, "group": [1, -1]}}
    d["args"]["b"] = {"dtype": "e4m3", "scale": {"dtype": "fp32", "static": True, "group": [-1, 1]}}
    c = Case.model_validate(d)
    assert c.args.b.scale.count(512, 256, weight=True) == 512
    assert c.args.a.scale.count(4, 256, weight=False) == 4


def test_moe_flops_without_a_gate_projection():
    gated = Case.model_validate(moe())
    plain = Case.model_validate(moe(activation={"kind": "gelu", "gated": False}))
    t, h, k, i = 8, 256, 2, 128
    assert gated.flops() - plain.flops() == 2 * t * k * h * i


def test_bias_bytes_follow_the_bias_dtype():
    c = Case.model_validate(gemm(m=1, n=64, k=64, bias="fp32"))
    plain = Case.model_validate(gemm(m=1, n=64, k=64))
    assert c.min_bytes() - plain.min_bytes() == 64 * 4


# --- count and step: scenario metadata (docs/case-format.md) -------------------------------------------
_GEMM_ARGS = {"m": 64, "n": 2112, "k": 7168, "a": {"dtype": "bf16"}, "b": {"dtype": "bf16"}}


def test_count_and_step_are_typed_metadata_outside_the_key():
    plain = Case.model_validate({"type": "gemm", "args": _GEMM_ARGS})
    scenario = Case.model_validate({"type": "gemm", "args": _GEMM_ARGS, "count": 61, "step": "decode"})
    assert (scenario.count, scenario.step) == (61, "decode")
    assert (plain.count, plain.step) == (None, None)
    assert scenario.key() == plain.key() and scenario == plain


def test_count_and_step_round_trip_through_to_json():
    case = Case.model_validate({"type": "gemm", "args": _GEMM_ARGS, "sources": ["org/m/o_proj"], "count": 3,
                                "step": "prefill"})
    data = case.to_json()
    assert (data["count"], data["step"]) == (3, "prefill")
    assert list(data)[:5] == ["type", "args", "sources", "count", "step"]
    back = Case.model_validate(data)
    assert (back.count, back.step, back.sources) == (3, "prefill", ["org/m/o_proj"])
    assert "count" not in Case.model_validate({"type": "gemm", "args": _GEMM_ARGS}).to_json()


@pytest.mark.parametrize(("field", "value", "words"), [
    ("count", 0, "greater than 0"), ("count", 1.5, "integer"), ("count", "2", "integer"), ("count", True, "integer"),
    ("step", "warmup", "'decode' or 'prefill'"), ("step", 1, "'decode' or 'prefill'"),
])
def test_count_and_step_are_validated(field, value, words):
    with pytest.raises(ValidationError) as err:
        Case.model_validate({"type": "gemm", "args": _GEMM_ARGS, field: value})
    first = err.value.errors()[0]
    assert first["loc"][0] == field and words in first["msg"]
