"""How many decoder layers of a checkpoint run each kind of module: the `count` of a scenario case.

A scenario case's count is how many times one step runs its op (docs/serving.md). The layers are
read from the config as vLLM builds the decoder: MoE layers are those after `first_k_dense_replace`
that `mlp_only_layers` does not name; with linear attention (Qwen3.5, Qwen3-Next) one layer in
`full_attention_interval` (the last of each run) is full attention and the others linear, unless
`layer_types` lists them; DeepSeek-V4 layers carry a compress ratio each (`compress_ratios`) and its
first `num_hash_layers` MoE layers are hash-routed.
"""

from __future__ import annotations

from dataclasses import dataclass

from operatorx.catalog.arch import Arch
from operatorx.catalog.errors import CatalogError, MissingField

__all__ = ["LayerCounts", "layer_counts"]


@dataclass(frozen=True)
class LayerCounts:
    """Decoder layers by the module they run."""

    layers: int
    full_attention: int
    linear_attention: int
    dense_mlp: int
    moe: int
    hash_moe: int
    #: DeepSeek-V4: compress ratio (max(1, r), as vLLM reads it) -> layers at that ratio.
    compress_ratios: tuple[tuple[int, int], ...] = ()

    def at_ratio(self, ratio: int) -> int:
        return dict(self.compress_ratios).get(ratio, 0)


def _attention_split(arch: Arch, layers: int) -> tuple[int, int]:
    """(full attention layers, linear attention layers)."""
    types = arch.config.get("layer_types")
    if isinstance(types, list) and types:
        kinds = types[:layers]
        linear = sum(1 for t in kinds if t == "linear_attention")
        return layers - linear, linear
    if not arch.has_linear_attention:
        return layers, 0
    interval = arch.int("full_attention_interval", "the full/linear attention layer split")
    if interval < 1:
        raise CatalogError(f"config field 'full_attention_interval' must be at least 1 ({arch.origin})")
    full = layers // interval                       # layer i is full attention when (i + 1) % interval == 0
    return full, layers - full


def layer_counts(arch: Arch) -> LayerCounts:
    """The layer counts of one checkpoint; MissingField names a fact the split needs."""
    layers = arch.int("num_hidden_layers", "the layer counts of a serving step")
    if layers < 1:
        raise CatalogError(f"config field 'num_hidden_layers' must be at least 1 ({arch.origin})")
    full, linear = _attention_split(arch, layers)
    dense = layers if not arch.is_moe else min(arch.dense_layers(), layers)
    moe = layers - dense
    hashed = min(int(arch.opt("num_hash_layers", 0) or 0), moe)
    ratios: dict[int, int] = {}
    if arch.attention == "dsv4":
        raw = arch.get("compress_ratios", "DeepSeek-V4 layers (compress_ratios)")
        if not isinstance(raw, list) or len(raw) < layers:
            raise MissingField("compress_ratios", f"one compress ratio per decoder layer ({arch.origin})")
        for r in raw[:layers]:
            ratios[max(1, int(r))] = ratios.get(max(1, int(r)), 0) + 1
    return LayerCounts(layers=layers, full_attention=full, linear_attention=linear, dense_mlp=dense, moe=moe,
                       hash_moe=hashed, compress_ratios=tuple(sorted(ratios.items())))
