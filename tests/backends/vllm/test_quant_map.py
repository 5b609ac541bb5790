"""Descriptor → vLLM config mapping, on CPU without vLLM."""

from __future__ import annotations

import pytest

from operatorx.backends.vllm import quant_map as qm
from operatorx.spec import load_testlist, resolve_testlist
from operatorx.spec.gemm import GemmArgs
from operatorx.spec.moe import MoeArgs
from tests.backends.vllm.cases import gemm_case, moe_case


def _gemm(scheme: str, **kw: object) -> object:
    args = gemm_case(scheme, **kw).args  # type: ignore[arg-type]
    assert isinstance(args, GemmArgs)
    return qm.gemm_plan(args)


def _moe(scheme: str, **kw: object) -> object:
    args = moe_case(scheme, **kw).args  # type: ignore[arg-type]
    assert isinstance(args, MoeArgs)
    return qm.moe_plan(args)


def test_bf16_is_unquantized() -> None:
    plan = _gemm("bf16")
    assert isinstance(plan, qm.Plan) and plan.quant is None and plan.scheme == "bf16"


@pytest.mark.parametrize("scheme", ["fp8_block", "fp8_block_ue8m0"])
def test_block_fp8_is_fp8config_with_blocks(scheme: str) -> None:
    plan = _gemm(scheme)
    assert isinstance(plan, qm.Plan) and plan.scheme == "fp8_block"
    assert plan.quant is not None and plan.quant.cls == "Fp8Config"
    assert plan.quant.config == {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    assert "DeepGemm" in plan.expected_sm90


def test_block_fp8_with_bf16_weight_scales_plans_fp32_params_from_bf16() -> None:
    plan = _gemm("fp8_block_bf16scale")
    assert isinstance(plan, qm.Plan) and plan.scheme == "fp8_block" and plan.weight_scale_dtype == "bf16"
    assert plan.quant is not None and plan.quant.config["weight_block_size"] == [128, 128]
    plain = _gemm("fp8_block")
    assert isinstance(plain, qm.Plan) and plain.weight_scale_dtype == "fp32"


def test_static_per_tensor() -> None:
    plan = _gemm("fp8_tensor_static")
    assert isinstance(plan, qm.Plan) and plan.quant is not None
    assert plan.quant.config["activation_scheme"] == "static" and "weight_block_size" not in plan.quant.config


def test_dynamic_per_tensor_is_refused_as_per_token_in_vllm() -> None:
    why = _gemm("fp8_tensor_dynamic")
    assert isinstance(why, str) and "per token" in why


def test_per_token_per_tensor_weight_is_fp8config_dynamic() -> None:
    plan = _gemm("fp8_token_tensor")
    assert isinstance(plan, qm.Plan) and plan.quant is not None
    assert plan.quant.config == {"quant_method": "fp8", "activation_scheme": "dynamic"}


def test_per_channel_linear_is_modelopt_and_moe_is_compressed_tensors() -> None:
    plan = _gemm("fp8_token_channel")
    assert isinstance(plan, qm.Plan) and plan.quant is not None
    assert plan.quant.cls == "ModelOptFp8Config" and plan.quant.config["quant_algo"] == "FP8_PER_CHANNEL_PER_TOKEN"
    assert plan.quant.requires == ()
    moe = _moe("fp8_token_channel")
    assert isinstance(moe, qm.Plan) and moe.quant is not None
    assert moe.quant.cls == "CompressedTensorsConfig" and moe.quant.requires == ("compressed_tensors",)
    group = moe.quant.config["config_groups"]["group_0"]
    assert group["weights"]["strategy"] == "channel" and group["input_activations"]["strategy"] == "token"


@pytest.mark.parametrize("scheme,words", [("mxfp8", "Marlin"), ("nvfp4", "no fp4 MMA"),
                                          ("mxfp4_w4a16", "weight-only")])
def test_what_vllm_only_runs_weight_only_or_emulated_is_refused(scheme: str, words: str) -> None:
    why = _gemm(scheme, n=512, k=512)
    assert isinstance(why, str) and words in why


def test_gemm_out_dtype_and_activation_refused() -> None:
    assert isinstance(_gemm("bf16", out="fp32"), str)
    assert isinstance(_gemm("bf16", activation="silu"), str)


def test_moe_plans() -> None:
    for scheme, want in (("bf16", "bf16"), ("fp8_block", "fp8_block")):
        for style in ("deepseek", "qwen"):
            plan = _moe(scheme, style=style)
            assert isinstance(plan, qm.Plan) and plan.scheme == want, (scheme, style, plan)
    assert isinstance(_moe("fp8_tensor_static"), str)
    assert isinstance(_moe("nvfp4"), str)


def test_capture_sizes_follow_vllm_026_default() -> None:
    sizes = qm.capture_sizes()
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 512 == qm.MAX_CAPTURE_SIZE
    assert 248 in sizes and 256 in sizes and 264 not in sizes and 272 in sizes
    assert len(sizes) == 3 + 31 + 17
    assert qm.capture_sizes(16) == [1, 2, 4, 8, 16]


def test_shipped_testlists_map_without_errors() -> None:
    """Every shipped case gets a plan or a reason; the schemes the issue names get plans."""
    planned: dict[str, int] = {}
    for name in ("gemm_perf", "gemm_fp8", "moe_small"):
        for case in load_testlist(resolve_testlist(name)):
            plan = qm.gemm_plan(case.args) if isinstance(case.args, GemmArgs) else qm.moe_plan(case.args)
            assert isinstance(plan, (str, qm.Plan))
            if isinstance(plan, qm.Plan):
                planned[f"{case.type}:{plan.scheme}"] = planned.get(f"{case.type}:{plan.scheme}", 0) + 1
    assert planned.get("gemm:bf16", 0) > 0 and planned.get("gemm:fp8_block", 0) > 0
    assert planned.get("gemm:fp8_token_channel", 0) > 0 and planned.get("gemm:fp8_tensor_static", 0) > 0
    assert planned.get("moe:fp8_block", 0) > 0 and planned.get("moe:bf16", 0) > 0
