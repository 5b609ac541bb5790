"""Without vLLM every case is unsupported with the reason; pure helpers run on CPU."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from operatorx.backends import Unsupported, get_backend
from operatorx.backends.vllm import env as vllm_env
from operatorx.backends.vllm.graphs import graph_size
from operatorx.backends.vllm.moe_build import RouterHook
from operatorx.backends.vllm.quant_map import capture_sizes
from operatorx.backends.vllm.reference import act_quant_dequant, best_flavor, route_weights
from operatorx.backends.vllm.weights import load_params, quantize_matrix
from tests.backends.vllm.cases import gemm_case, moe_case


@pytest.fixture
def no_vllm(monkeypatch: pytest.MonkeyPatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(vllm_env.importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    vllm_env.vllm_missing.cache_clear()
    yield
    vllm_env.vllm_missing.cache_clear()


def test_registered_and_unsupported_without_vllm(no_vllm: None) -> None:
    import operatorx.backends.vllm  # noqa: F401  (registers)

    gemm, moe = get_backend("vllm", "gemm"), get_backend("vllm", "moe")
    assert gemm is not None and moe is not None
    assert gemm.supports(gemm_case("fp8_block"), "cuda") == "vLLM is not installed (pip install operatorx[vllm])"
    assert moe.supports(moe_case("bf16"), "cuda") == "vLLM is not installed (pip install operatorx[vllm])"
    with pytest.raises(Unsupported, match="not installed"):
        gemm.prepare(gemm_case("bf16"), "cuda")
    # a scheme vLLM cannot run is refused for that reason first, vLLM or not
    assert "per token" in (gemm.supports(gemm_case("fp8_tensor_dynamic"), "cuda") or "")
    assert "CUDA" in (gemm.supports(gemm_case("bf16"), "cpu") or "")


def test_quantize_matrix_layouts() -> None:
    w = torch.randn(256, 384) / 20
    block = quantize_matrix(w, "fp8_block")
    assert block.q.dtype == torch.float8_e4m3fn and tuple(block.scale.shape) == (2, 3)
    assert torch.equal(block.scale, torch.exp2(torch.log2(block.scale).round()))   # powers of two
    assert (block.dequant() - w).norm() / w.norm() < 0.05
    tensor = quantize_matrix(w, "fp8_tensor_static", (128, 128))
    assert tuple(tensor.scale.shape) == (2,)
    assert (tensor.dequant() - w).norm() / w.norm() < 0.05
    channel = quantize_matrix(w, "fp8_token_channel")
    assert tuple(channel.scale.shape) == (256,)
    assert (channel.dequant(slice(0, 8)) - w[:8]).norm() / w[:8].norm() < 0.05


def test_load_params_reshapes_unit_dims_and_names_mismatches() -> None:
    m = torch.nn.Module()
    m.weight = torch.nn.Parameter(torch.zeros(4, 2), requires_grad=False)
    m.weight_scale = torch.nn.Parameter(torch.zeros(4, 1), requires_grad=False)
    load_params(m, {"weight": torch.ones(4, 2), "weight_scale": torch.arange(4.0)}, "m")
    assert m.weight_scale[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(RuntimeError, match="weight_scale"):
        load_params(m, {"weight": torch.ones(4, 2)}, "m")
    with pytest.raises(RuntimeError, match="does not fit"):
        load_params(m, {"weight": torch.ones(2, 4), "weight_scale": torch.ones(4)}, "m")


def test_best_flavor_names_the_activation_scales_used() -> None:
    x, w = torch.randn(8, 256), torch.randn(64, 256)
    out = act_quant_dequant(x, "fp8_block", "ue8m0") @ w.T
    err, flavor = best_flavor(out, "fp8_block", lambda f: act_quant_dequant(x, "fp8_block", f) @ w.T)
    assert flavor == "ue8m0" and err < 1e-6


def test_route_weights_renormalize_and_scale() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    w = route_weights(logits, torch.tensor([[3, 2]]), "sigmoid", True, 2.5)
    assert abs(float(w.sum()) - 2.5) < 1e-6


def test_graph_size_pads_like_vllm() -> None:
    sizes = capture_sizes()
    assert graph_size(1, sizes) == 1 and graph_size(3, sizes) == 4 and graph_size(100, sizes) == 104
    assert graph_size(512, sizes) == 512 and graph_size(513, sizes) is None


def test_router_hook_forces_ids_and_records() -> None:
    inner = lambda *a, **k: (torch.ones(2, 2), torch.tensor([[0, 1], [2, 3]], dtype=torch.int32))  # noqa: E731
    hook = RouterHook(inner, torch.tensor([[5, 6], [7, 8]]))
    hook.record = True
    w, ids = hook(None, None)
    assert ids.dtype == torch.int32 and ids.tolist() == [[5, 6], [7, 8]]
    assert hook.seen is not None and hook.seen["router_ids"].tolist() == [[0, 1], [2, 3]]


def test_a_missing_package_of_a_quant_config_is_unsupported_with_how_to_install_it() -> None:
    from operatorx.backends.base import Unsupported
    from operatorx.backends.vllm.env import build_quant_config
    from operatorx.backends.vllm.quant_map import QuantConfigSpec

    spec = QuantConfigSpec(module="vllm.x", cls="CompressedTensorsConfig", config={},
                           requires=("operatorx_no_such_pkg",))
    with pytest.raises(Unsupported, match=r"needs the 'operatorx_no_such_pkg' package.*"
                                          r"pip install operatorx-no-such-pkg"):
        build_quant_config(spec)
