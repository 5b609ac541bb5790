from __future__ import annotations

import pytest
import torch

from operatorx.backends import Unsupported, get_backend
from operatorx.backends.torch.gemm import TorchGemm
from operatorx.backends.torch.quant import dequantize, quantize
from operatorx.backends.torch.scaled_mm import recipe_for, scale_a_layout, scale_b_layout
from operatorx.spec import Case, Scale
from tests.conftest import fp8_block, gemm


def _case(d: dict) -> Case:
    return Case.model_validate(d)


def test_registered():
    assert isinstance(get_backend("torch", "gemm"), TorchGemm)
    assert get_backend("torch", "allreduce") is None


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_cpu_float_gemm_runs_and_checks(dtype):
    c = _case(gemm(m=3, n=64, k=96, a={"dtype": dtype}, b={"dtype": dtype}, out=dtype))
    be = TorchGemm()
    assert be.supports(c, "cpu") is None
    p = be.prepare(c, "cpu")
    out = p.fn()
    assert out.shape == (3, 64) and out.dtype == getattr(torch, {"bf16": "bfloat16", "fp32": "float32"}[dtype])
    check = p.check()
    assert check.ok, check
    p.release()


def test_check_catches_a_wrong_result(monkeypatch):
    import operatorx.backends.torch.gemm as g

    p = TorchGemm().prepare(_case(gemm(m=3, n=64, k=96)), "cpu")
    linear = g.F.linear
    monkeypatch.setattr(g.F, "linear", lambda *a, **k: linear(*a, **k) * 1.05)  # a kernel 5% off
    assert not p.check().ok


@pytest.mark.parametrize("case,reason", [
    (gemm(a={"dtype": "bf16"}, b={"dtype": "fp16"}), "one dtype"),
    (gemm(out="fp32"), "returns bf16"),
    (gemm(activation="silu"), "fused activation"),
    (gemm(bias="fp32"), "bias in fp32"),
    (fp8_block(), "fp8 on CPU"),
])
def test_cpu_refusals(case, reason):
    assert reason in TorchGemm().supports(_case(case), "cpu")


def test_fp4_and_weight_only_are_refused_with_reasons():
    mx = gemm()
    mx["args"]["a"] = {"dtype": "e2m1", "scale": {"dtype": "ue8m0", "static": False, "group": [1, 32]}}
    mx["args"]["b"] = {"dtype": "e2m1", "scale": {"dtype": "ue8m0", "static": True, "group": [1, 32]}}
    assert "fp4" in TorchGemm().supports(_case(mx), "cuda")
    w4 = gemm()
    w4["args"]["b"] = {"dtype": "e2m1", "scale": {"dtype": "ue8m0", "static": True, "group": [1, 32]}}
    assert "fp4" in TorchGemm().supports(_case(w4), "cuda")
    w8 = gemm()
    w8["args"]["b"] = {"dtype": "e4m3", "scale": {"dtype": "fp32", "static": True, "group": [-1, 1]}}
    assert "weight-only" in TorchGemm().supports(_case(w8), "cuda")


def test_unknown_fp8_recipe_names_the_known_ones():
    d = fp8_block()
    d["args"]["b"]["scale"]["group"] = [64, 128]
    reason = TorchGemm().supports(_case(d), "cuda")
    assert "no recipe" in reason and "1x128×128x128" in reason


def test_memory_check_refuses_before_allocating(monkeypatch):
    import operatorx.backends.torch.memory as mem

    monkeypatch.setattr(mem, "free_bytes", lambda device: (1 << 20, 1 << 30))
    with pytest.raises(Unsupported, match="GiB free"):
        TorchGemm().prepare(_case(gemm(m=64, n=1024, k=1024)), "cpu")


@pytest.mark.parametrize("group,weight,shape", [
    ([128, 128], True, (576, 256)), ([1, 128], False, (3, 256)), ([-1, -1], False, (5, 64)),
    ([-1, 1], True, (7, 64)), ([1, -1], False, (4, 32)),
])
@pytest.mark.parametrize("scale_dtype", ["fp32", "ue8m0"])
def test_quantize_round_trip(group, weight, shape, scale_dtype):
    scale = Scale(dtype=scale_dtype, static=True, group=group)
    x = torch.randn(*shape)
    q, s = quantize(x, "e4m3", scale, weight)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape
    rel = float((dequantize(q, s, scale.block(*shape, weight)) - x).norm() / x.norm())
    assert rel < 0.05
    if scale_dtype == "ue8m0":
        assert torch.equal(torch.exp2(torch.log2(s).round()), s)  # powers of two


def test_block_scale_layouts_match_cublaslt_strides():
    c = _case(fp8_block(m=8, n=384, k=640))
    recipe, _ = recipe_for(c.args)
    sa = torch.rand(8, 5)
    la = scale_a_layout(recipe, sa)
    assert la.shape == (8, 5) and la.stride() == (1, 8)
    sb = torch.rand(3, 5)
    lb = scale_b_layout(recipe, sb)
    assert lb.shape == (8, 3) and lb.stride() == (1, 8)  # K blocks padded 5 → 8
    assert torch.equal(lb[:5], sb.t())


def test_block_scale_layout_at_m1_keeps_the_strides_torch_checks():
    c = _case(fp8_block(m=1, n=256, k=7168))
    recipe, _ = recipe_for(c.args)
    la = scale_a_layout(recipe, torch.rand(1, 56))
    assert la.stride() == (1, 1)


# --- on the GPU -------------------------------------------------------------------------------
FP8_CASES = {
    "tensorwise": {"a": {"dtype": "e4m3", "scale": {"dtype": "fp32", "static": False, "group": [-1, -1]}},
                   "b": {"dtype": "e4m3", "scale": {"dtype": "fp32", "static": True, "group": [-1, -1]}}},
    "tensorwise_static": {"a": {"dtype": "e4m3", "scale": {"dtype": "fp32", "static": True, "group": [-1, -1]}},
                          "b": {"dtype": "e4m3", "scale": {"dtype": "fp32", "static": True, "group": [-1, -1]}}},
    "rowwise": {"a": {"dtype": "e4m3", "scale": {"dtype": "fp32", "static": False, "group": [1, -1]}},
                "b": {"dtype": "e4m3", "scale": {"dtype": "fp32", "static": True, "group": [-1, 1]}}},
    "block": fp8_block()["args"],
    "block_ue8m0": fp8_block(sd="ue8m0")["args"],
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(FP8_CASES))
@pytest.mark.parametrize("m", [16, 256])
def test_gpu_fp8_recipes_run_and_match_reference(name, m):
    args = {**FP8_CASES[name], "m": m, "n": 2112, "k": 1024, "out": "bf16"}
    c = _case({"type": "gemm", "args": args})
    be = TorchGemm()
    assert be.supports(c, "cuda") is None
    p = be.prepare(c, "cuda")
    check = p.check()
    assert check.ok, check
    p.release()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_gpu_float_gemm(dtype):
    c = _case(gemm(m=64, n=1024, k=512, a={"dtype": dtype}, b={"dtype": dtype}, out=dtype))
    p = TorchGemm().prepare(c, "cuda")
    assert p.check().ok


@pytest.mark.gpu
def test_gpu_block_fp8_at_m1_is_a_real_outcome():
    """On the H200 (torch 2.11) cuBLASLt refuses block fp8 at M=1: that must be `unsupported`
    with the library's words, or, if a newer library runs it, a checked result."""
    c = _case(fp8_block(m=1, n=2112, k=7168))
    try:
        p = TorchGemm().prepare(c, "cuda")
    except Unsupported as err:
        assert "refused" in str(err)
    else:
        assert p.check().ok
