"""The whole torch MoE layer against its fp32 reference on small bf16 layers (CPU), refusals,
metadata and the memory check."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from operatorx.backends.base import Unsupported
from operatorx.backends.torch.moe import TorchMoe, build_layer
from operatorx.backends.torch.moe.build import device_bytes
from operatorx.backends.torch.moe.reference import check_layer
from operatorx.spec import Case
from tests.conftest import moe

BF16 = {"dtype": "bf16"}
E4M3_ROW = {"dtype": "e4m3", "scale": {"dtype": "fp32", "static": False, "group": [1, -1]}}
E4M3_CHAN = {"dtype": "e4m3", "scale": {"dtype": "fp32", "static": True, "group": [-1, 1]}}
E4M3_1x128 = {"dtype": "e4m3", "scale": {"dtype": "fp32", "static": False, "group": [1, 128]}}
E4M3_128 = {"dtype": "e4m3", "scale": {"dtype": "fp32", "static": True, "group": [128, 128]}}
MXFP4 = {"dtype": "e2m1", "scale": {"dtype": "ue8m0", "static": True, "group": [1, 32]}}
DEEPSEEK_ROUTER = {"gate": {"dtype": "bf16"}, "scoring": "sigmoid",
                   "select": {"kind": "grouped_topk", "groups": 4, "topk_groups": 2},
                   "bias": True, "renormalize": True, "scale": 2.5}


def _experts(**over: Any) -> dict[str, Any]:
    return {"num": 8, "top_k": 2, "inter": 128, "w1": BF16, "w2": BF16, **over}


def case(**over: Any) -> Case:
    return Case.model_validate(moe(**over))


VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "deepseek_like": {"tokens": 33, "experts": _experts(num=16, top_k=4), "router": DEEPSEEK_ROUTER,
                      "shared": {"count": 1, "inter": 128, "w1": BF16, "w2": BF16}},
    "gptoss_like": {"experts": _experts(bias=True), "router": {"gate": {"dtype": "bf16"}, "scoring": "softmax",
                    "select": {"kind": "topk"}, "renormalize": True},
                    "activation": {"kind": "swigluoai", "interleaved": True, "limit": 7.0, "alpha": 1.702}},
    "gelu_plain": {"activation": {"kind": "gelu", "gated": False}},
    "gelu_tanh": {"activation": {"kind": "gelu_tanh"}},
    "silu_limit": {"activation": {"kind": "silu", "limit": 0.5}},
    "sqrtsoftplus_bias": {"router": {"gate": {"dtype": "fp32"}, "scoring": "sqrtsoftplus", "select": {"kind": "topk"},
                                     "bias": True, "renormalize": True, "scale": 1.5}},
    "latent": {"experts": _experts(latent=128, latent_norm=True)},
    "zero_experts": {"tokens": 32, "experts": _experts(zero=4, top_k=3)},
    "weight_on_input": {"experts": _experts(top_k=1),
                        "router": {"gate": {"dtype": "bf16"}, "scoring": "sigmoid", "select": {"kind": "topk"},
                                   "weight_on_input": True}},
    "hash": {"router": {"gate": {"dtype": "bf16"}, "scoring": "sqrtsoftplus",
                        "select": {"kind": "hash", "vocab": 1000}, "renormalize": True}},
    "shared_gate": {"shared": {"count": 2, "inter": 64, "w1": BF16, "w2": BF16, "gate": "sigmoid"}},
    "out_fp32": {"out": "fp32"},
    "balanced": {"tokens": 16, "routing": {"distribution": "balanced", "seed": 1}},
    "single_hot": {"tokens": 16, "routing": {"distribution": "single_hot", "seed": 2}},
    "zipf": {"tokens": 64, "routing": {"distribution": {"kind": "zipf", "s": 1.2}, "seed": 3}},
    "zipf_zero": {"tokens": 64, "experts": _experts(zero=2), "routing": {"distribution": {"kind": "zipf", "s": 1.0}}},
    "ep_local": {"tokens": 32, "experts": _experts(local=2)},
    "ep_local_deepseek_like": {"tokens": 33, "experts": _experts(num=16, top_k=4, local=4, bias=True),
                               "router": DEEPSEEK_ROUTER, "shared": {"count": 1, "inter": 64, "w1": BF16, "w2": BF16}},
    "ep_local_balanced": {"tokens": 16, "experts": _experts(local=4), "routing": {"distribution": "balanced"}},
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_layer_matches_reference_on_cpu(name: str) -> None:
    c = case(**VARIANTS[name])
    backend = TorchMoe()
    assert backend.supports(c, "cpu") is None
    prepared = backend.prepare(c, "cpu")
    check = prepared.check()
    assert check.ok, check
    assert "0 of" in check.reference                 # every token's choice was a valid pick
    out = prepared.fn()
    assert out.shape == (c.args.tokens, c.args.hidden) and out.dtype == (torch.float32 if name == "out_fp32"
                                                                          else torch.bfloat16)


def test_metadata_and_bytes_follow_the_routing_used() -> None:
    c = case(tokens=16, routing={"distribution": "single_hot", "seed": 0})
    p = TorchMoe().prepare(c, "cpu")
    meta = p.metadata
    assert sum(meta["expert_load"]) == 16 * 2
    assert meta["experts_hit"] == 2 and sorted(meta["expert_load"])[-2:] == [16, 16]
    assert p.min_bytes == c.args.min_bytes(experts_hit=2)
    assert meta["routing"] == {"distribution": "single_hot", "seed": 0, "forced": True}
    assert "grouped_mm" in meta["calls"]["experts"]


def test_an_expert_parallel_share_computes_only_the_pairs_its_experts_hold() -> None:
    """experts.local = 2 of 8: weights for 2 experts, and the pairs routed to the other 6 add nothing (the
    check holds the output against the fp32 per-expert loop over the held experts only)."""
    whole, share = case(tokens=64), case(tokens=64, experts=_experts(local=2))
    pw, ps = TorchMoe().prepare(whole, "cpu"), TorchMoe().prepare(share, "cpu")
    assert ps.check().ok
    layer_w, layer_s = build_layer(whole, "cpu"), build_layer(share, "cpu")
    assert layer_s.experts.w.num == 2 and layer_w.experts.w.num == 8
    ids = layer_s.forward(layer_s.x)[1].ids
    assert ps.metadata["local_pairs"] == int((ids < 2).sum()) and 0 < ps.metadata["local_pairs"] < 64 * 2
    assert ps.metadata["local_experts"] == 2 and "local_experts" not in pw.metadata
    assert ps.metadata["experts_hit"] <= 2 and ps.min_bytes < pw.min_bytes
    assert device_bytes(share.args, 64) < device_bytes(whole.args, 64)


def test_a_wrong_output_fails_the_check() -> None:
    layer = build_layer(case(tokens=16), "cpu")
    out, routed = layer.forward(layer.x)
    assert check_layer(layer, out, routed, 256).ok
    assert not check_layer(layer, out * 1.05, routed, 256).ok


def test_a_wrong_routing_is_caught_and_fails_the_check() -> None:
    layer = build_layer(case(tokens=16), "cpu")
    out, routed = layer.forward(layer.x)
    bad = copy.copy(routed)
    bad.ids = routed.ids.clone()
    bad.ids[:, 0] = torch.argmin(routed.logits.float(), dim=-1)      # the worst expert instead of the best
    check = check_layer(layer, out, bad, 256)
    assert "16 of 16" in check.reference and not check.ok


REFUSED = {
    "fp4 (e2m1)": {"experts": _experts(w1=MXFP4, w2=MXFP4)},
    "mixed/weight-only": {"experts": _experts(w1={"dtype": "e4m3", "scale": {"dtype": "fp32", "static": True,
                                                                               "group": [-1, 1]}},
                                              w2=E4M3_CHAN)},
    "fp8 on CPU": {"experts": _experts(a1=E4M3_1x128, w1=E4M3_128, w2=E4M3_128, a2=E4M3_1x128)},
    "bf16 only": {"experts": _experts(w1={"dtype": "fp16"}, w2={"dtype": "fp16"}, a1={"dtype": "fp16"},
                                      a2={"dtype": "fp16"})},
    "does not define it yet": {"activation": {"kind": "situ"}},
    "zero experts": {"experts": _experts(zero=4), "router": DEEPSEEK_ROUTER},
}


@pytest.mark.parametrize("needle", sorted(REFUSED))
def test_refusals_carry_the_reason(needle: str) -> None:
    reason = TorchMoe().supports(case(**REFUSED[needle]), "cpu")
    assert reason is not None and needle in reason


def test_w4a16_mxfp4_is_refused_not_emulated() -> None:
    reason = TorchMoe().supports(case(experts=_experts(w1=MXFP4, w2=MXFP4, bias=True)), "cpu")
    assert reason is not None and "fp4" in reason and "never emulated" in reason


def test_full_deepseek_bf16_experts_are_counted_before_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    args = {"tokens": 1, "hidden": 7168, "experts": {"num": 256, "top_k": 8, "inter": 2048, "w1": BF16, "w2": BF16},
            "router": {**DEEPSEEK_ROUTER, "select": {"kind": "grouped_topk", "groups": 8, "topk_groups": 4}}}
    c = case(**args)
    need = device_bytes(c.args, 1)
    assert 22e9 < need < 24e9                         # ~22.5 GB of bf16 expert weights
    import operatorx.backends.torch.memory as memory
    monkeypatch.setattr(memory, "free_bytes", lambda device: (8 << 30, 16 << 30))
    with pytest.raises(Unsupported, match="GiB"):
        TorchMoe().prepare(c, "cpu")


def test_fp8_rowwise_plumbing_with_a_stand_in_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The e4m3 path's quantization, byte gather, scale layouts and reference, with torch's CUDA-only
    scaled_grouped_mm replaced by a per-group fp32 stand-in (a test double, never used by the backend)."""
    from operatorx.backends.torch.moe import experts as experts_mod
    from operatorx.backends.torch.moe import support
    from tests.backends.torch.test_moe_gpu import FP8_ROWWISE

    def stand_in(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
                 offs: torch.Tensor) -> torch.Tensor:
        assert a.dtype == b.dtype == torch.float8_e4m3fn and sa.dim() == 1 and sb.shape == (b.shape[0], b.shape[2])
        assert b.stride(1) == 1, "mat_b column-major"
        out, start = torch.empty(a.shape[0], b.shape[2], dtype=torch.bfloat16), 0
        for g, end in enumerate(offs.tolist()):
            out[start:end] = ((a[start:end].float() * sa[start:end, None]) @ (b[g].float() * sb[g])).bfloat16()
            start = end
        return out

    monkeypatch.setattr(experts_mod, "scaled_grouped_mm_fn", lambda: (stand_in, "stand-in"))
    monkeypatch.setattr(support, "experts_scheme", lambda args, device: "fp8_rowwise")
    monkeypatch.setattr(support, "shared_scheme", lambda args, device: "fp8_rowwise")
    layer = build_layer(case(tokens=37, **FP8_ROWWISE), "cpu")
    out, routed = layer.forward(layer.x)
    check = check_layer(layer, out, routed, 256)
    assert check.ok and check.rel_error > 1e-3, check     # fp8 error is visible, and within the bound
