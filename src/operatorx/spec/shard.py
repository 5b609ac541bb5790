"""`--rank-local`: one rank's shard of a split case, timed on one device with its collectives left out.

A split case (`parallel` with tp·dp > 1) is the whole layer run over W ranks. On one device the
run either refuses it (it needs W GPUs) or, with `--rank-local`, times the computation one rank
does: the shard. How a layer splits is decided here per op type, the way vLLM builds the layer:
- gemm (tp T): by the layer's role in the case's sources (`split_of_role`): column-parallel
  splits N, row-parallel splits K, vocab-parallel splits the vocab padded to 64, replicated splits
  nothing; where the catalog holds the checkpoint, its own per-rank shape (`LayerShapes`);
- moe, no ep: the experts' intermediate size splits over the W = T·D ranks (vLLM flattens TP
  across DP for the experts) and each rank's experts see all D batches; the shared experts split
  over T;
- moe, ep = W: rank 0 holds the first num/W experts whole (`experts.local`) and computes the
  token-expert pairs of all D batches that land on them; the shared experts split over T.
A dp MoE with shared experts has no single-device shard (its shared experts see the rank's own
batch, its routed experts all D batches).
The row keeps the case it was asked for and says what it timed (`RankLocal`), so a shard is never
taken for the whole layer, nor compared with a multi-rank row of the same case.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Protocol

from pydantic import NonNegativeInt, PositiveInt

from operatorx.spec.base import SpecModel

__all__ = ["GemmSplit", "RankLocal", "ShardRefused", "VOCAB_PADDING", "divide", "split_of_role", "LayerShapes",
           "NO_LAYER_SHAPES"]

GemmSplit = Literal["column", "row", "vocab", "replicated"]
#: vLLM's DEFAULT_VOCAB_PADDING_SIZE: a vocab-parallel layer pads its rows to this before splitting.
VOCAB_PADDING = 64


class ShardRefused(ValueError):
    """The case has no rank-local shard this version can time; the message says why."""


class RankLocal(SpecModel):
    """What a `--rank-local` row timed: rank `rank` of `world`, split as `rule` says, shard args `shard`."""

    world: PositiveInt
    rank: NonNegativeInt = 0
    split: str
    """The case's split, e.g. `tp8` or `dp8·ep8`."""
    rule: str
    """How the shard was cut, e.g. `row-parallel: k 33792 -> 4224 (by role mlp.down_proj)`."""
    shard: dict[str, Any]
    """The shard's args as the case format writes them: what the backend ran."""


def divide(total: int, parts: int, field: str) -> int:
    """`total / parts`, or ShardRefused naming the field the split does not divide."""
    if total % parts:
        raise ShardRefused(f"{field}={total} does not split {parts} ways")
    return total // parts


_REPLICATED_PARTS = ("compressor.", "indexer.", "hc_")
_REPLICATED = {"gate", "shared_expert_gate", "fused_qkv_a_proj", "q_a_proj", "kv_a_proj_with_mqa",
               "fused_wqa_wkv", "wo_a", "wq_a", "wkv"}
_COLUMN = {"qkv_proj", "q_proj", "k_proj", "v_proj", "q_b_proj", "kv_b_proj", "gate_up_proj", "gate_proj",
           "up_proj", "w1", "w3", "in_proj_qkvz", "in_proj_ba", "in_proj_qkv", "in_proj_z", "wq_b"}
_ROW = {"o_proj", "down_proj", "w2", "out_proj", "wo_b"}


def split_of_role(role: str) -> Optional[GemmSplit]:
    """How vLLM splits a layer of this role under TP (`mlp.down_proj` -> row); None when the name does not say.

    Column-parallel: q/k/v and fused qkv projections, `q_b_proj`, `kv_b_proj`, `gate_up_proj` (checkpoint
    names `w1`/`w3`), `in_proj_*`, DeepSeek-V4's `attn.wq_b`. Row-parallel: `o_proj`, `down_proj` (`w2`),
    `out_proj`, `attn.wo_b`. Vocab-parallel: `lm_head`. Replicated: the router `gate`,
    `shared_expert_gate`, the low-rank `*_a` projections, `attn.wo_a` (a case is one group's GEMM),
    compressor, indexer and hyper-connection weights.
    """
    base = role.split(":", 1)[0]                      # `:c4`, `:padded-from-...` suffixes
    if any(part in base for part in _REPLICATED_PARTS):
        return "replicated"
    last = base.rsplit(".", 1)[-1]
    if last == "lm_head":
        return "vocab"
    if last in _REPLICATED:
        return "replicated"
    if last in _COLUMN:
        return "column"
    if last in _ROW:
        return "row"
    return None


class LayerShapes(Protocol):
    """Per-rank shapes known from elsewhere (the catalog's checkpoints)."""

    def rank_shape(self, source: str, tp: int, full: tuple[int, int]) -> Optional[tuple[int, int]]:
        """The (n, k) one of `tp` ranks holds of the layer `source` names, if `full` is that whole layer."""
        ...


class _NoLayerShapes:
    def rank_shape(self, source: str, tp: int, full: tuple[int, int]) -> Optional[tuple[int, int]]:
        return None


NO_LAYER_SHAPES: LayerShapes = _NoLayerShapes()
