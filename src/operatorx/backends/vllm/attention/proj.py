"""An attention module's projections in the checkpoint's stored form: the quant config vLLM builds them
under, the tensors each layer loads, and the weights the fp32 reference reads.

The rule: every projection of a case shares one plan (support.projection_plan). A vLLM layer that
fuses several projections (qkv_proj, fused_qkv_a_proj) is quantized as the one [N, K] matrix it holds,
as a checkpoint loader's shards land in it: with 128x128 blocks the shard boundaries are block
boundaries (vLLM refuses a merged layer whose inner shards are not), so the stored blocks are the
per-projection ones. The reference reads the dequantized values, which are exact in bf16 (e4m3
values times power-of-two scales), and quantizes its activations as the layer does (`activation`).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Optional

import torch

from operatorx.backends.torch.attention.reference import Activation
from operatorx.backends.vllm.quant_map import Plan
from operatorx.backends.vllm.reference import ACT_FLAVORS, act_quant_dequant
from operatorx.backends.vllm.weights import load_params, quantize_matrix, scale_name

__all__ = ["StoredLayer", "store", "load_stored", "load_layers", "check_parameters", "stored_names", "quant_config_of",
           "activation", "flavors", "projection_kernels"]


@dataclass(frozen=True)
class StoredLayer:
    """One vLLM layer's checkpoint tensors (parameter name -> tensor) and its weight as the reference reads it."""

    tensors: dict[str, torch.Tensor]
    weight: torch.Tensor
    """bf16 [N, K]: the dequantized stored weight (the weight itself for bf16)."""


def store(w: torch.Tensor, plan: Plan) -> StoredLayer:
    """`w` [N, K] in the plan's stored form; refused (RuntimeError) if its dequantized values are not exact
    in bf16, which the reference relies on."""
    if plan.scheme == "bf16":
        return StoredLayer({"weight": w}, w)
    m = quantize_matrix(w, plan.scheme, scale_dtype=plan.weight_scale_dtype)
    tensors = {"weight": m.q}
    if m.scale is not None:
        tensors[scale_name(plan.scheme) or "weight_scale"] = m.scale
    exact = m.dequant()
    weight = exact.to(torch.bfloat16)
    if not torch.equal(weight.float(), exact):
        raise RuntimeError(f"{plan.scheme}: a dequantized weight is not exact in bf16")
    return StoredLayer(tensors, weight)


def load_stored(layer: Any, stored: StoredLayer, what: str) -> None:
    """Copy the stored tensors into the layer's parameters of the same names."""
    load_params(layer, stored.tensors, what)


def stored_names(stored: dict[str, StoredLayer]) -> set[str]:
    """The module parameter names the stored layers fill (`layer.tensor`)."""
    return {f"{layer}.{t}" for layer, s in stored.items() for t in s.tensors}


def check_parameters(module: Any, expected: AbstractSet[str], what: str) -> None:
    """RuntimeError unless the module holds exactly the `expected` parameters: one vLLM added, renamed or
    dropped fails by name instead of staying at its init value."""
    have = {n for n, _ in module.named_parameters()}
    if have != expected:
        raise RuntimeError(f"{what}: parameters {sorted(have)}, this backend fills {sorted(expected)}")


def load_layers(module: Any, stored: dict[str, StoredLayer], expected: AbstractSet[str], what: str) -> None:
    """check_parameters, then each stored layer copied into the submodule of its name."""
    check_parameters(module, expected, what)
    for layer, s in stored.items():
        load_stored(module.get_submodule(layer), s, f"{what}.{layer}")


def quant_config_of(plan: Plan) -> Any:
    """vLLM's quant config object for the plan (None for bf16); imports vLLM."""
    from operatorx.backends.vllm.env import build_quant_config

    return build_quant_config(plan.quant)


def projection_kernels(module: Any, names: tuple[str, ...], plan: Plan) -> dict[str, Any]:
    """What vLLM built each projection layer with (quant method, kernel); refused (Unsupported) when a
    quantized plan's layer came out unquantized, which would time another op."""
    from operatorx.backends.base import Unsupported
    from operatorx.backends.vllm.common import kernel_of_linear

    layers = {name: kernel_of_linear(getattr(module, name)) for name in names}
    if plan.quantized:
        plain = [name for name, k in layers.items() if k["quant_method"] == "UnquantizedLinearMethod"]
        if plain:
            raise Unsupported(f"vLLM built {', '.join(plain)} unquantized under {plan.quant.cls if plan.quant else '-'}"
                              f" for {plan.scheme}; timing bf16 in its place would be another op")
    return {"scheme": plan.scheme, "quant_config": plan.quant.cls if plan.quant else None,
            "expected_sm90": plan.expected_sm90, "weight_scale_dtype": plan.weight_scale_dtype, "layers": layers}


def flavors(plan: Plan) -> tuple[str, ...]:
    """The activation-scale flavors vLLM may run the plan's layers with (reference.ACT_FLAVORS)."""
    return ACT_FLAVORS[plan.scheme]


def activation(plan: Plan, flavor: Optional[str]) -> Activation:
    """The activation quantization of the plan's layers under `flavor` (identity for bf16)."""
    scheme = plan.scheme

    def quantized(x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        return act_quant_dequant(x.reshape(-1, shape[-1]), scheme, flavor or "none").reshape(shape)

    return quantized
