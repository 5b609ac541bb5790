"""Attention op types as upstream OperatorX spells them: gqa, qsa, mla, mla_dsa, dsv4_attn, gdn, kda.

Each times one attention module whole, from the post-norm hidden states [T, hidden] to the module
output before the residual add, over a KV cache (or linear-attention state) filled for every
request's context. This version validates these cases field by field, so a file that holds them
loads and a malformed one is refused with its field. gqa, mla, mla_dsa, dsv4_attn and gdn have
backends (IMPLEMENTED); qsa and kda have none yet: their rows read `unsupported: op type ... is not
implemented yet: ` and what is missing (MISSING).

Shared fields:
- `batch`: `groups` of `count` requests with `q` new tokens each over `ctx` cached ones (an int, or
  `{dist: uniform, min, max}` drawn per request from `seed`); `pages` contiguous or shuffled.
- `proj`: `{module: {a, b}}` gemm operand descriptors per projection; a projection left out is bf16.
- `kv_cache_dtype`: the serving engine's `--kv-cache-dtype` (auto = the model dtype).

`cost()` counts one call's FLOPs and fewest bytes by part (spec/attention_cost.py); `flops()` and
`min_bytes()` are its totals. Every term is in docs/case-format.md, "Attention types: FLOPs and bytes".
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from math import ceil
from typing import Any, ClassVar, Literal, Optional, Union

from pydantic import Field, PositiveFloat, field_validator, model_validator

from operatorx.spec.attention_cost import AttentionCost, CostTally, attended
from operatorx.spec.base import Count, Int64, Size, SpecModel
from operatorx.spec.op_type import OpArgs
from operatorx.spec.operand import Operand
from operatorx.spec.parallel import Parallel, check_family_axes
from operatorx.spec.shard import NO_LAYER_SHAPES, LayerShapes, ShardRefused, divide

__all__ = ["ATTENTION_TYPES", "AttentionArgs", "Batch", "BatchGroup", "CtxRange", "ProjOperands", "RopeScaling"]

Selection = Literal["natural", "uniform", "recent", "clustered"]
StateDType = Literal["fp32", "bf16"]

#: Bytes per cached element by `kv_cache_dtype` (auto = the bf16 model dtype); fp8's scales are per
#: tensor in vLLM's fp8 caches, so no per-token bytes. fp8_ds_mla has its own layout (per type).
_KV_ELEMENT_BYTES = {"auto": 2, "bf16": 2, "fp8": 1}
_STATE_BYTES = {"fp32": 4, "bf16": 2}
#: Linear attention's conv state is kept in the model dtype (bf16).
_CONV_STATE_BYTES = 2
#: A reused top-k is read as int32 token indices.
_INDEX_BYTES = 4


class CtxRange(SpecModel):
    """Context lengths drawn per request, uniformly in [min, max]."""

    dist: Literal["uniform"]
    min: Count
    max: Count

    @model_validator(mode="after")
    def _ordered(self) -> CtxRange:
        if self.min > self.max:
            raise ValueError(f"min={self.min} exceeds max={self.max}")
        return self


class BatchGroup(SpecModel):
    count: Size
    q: Size
    ctx: Union[Count, CtxRange]

    def mean_ctx(self) -> float:
        return float(self.ctx) if isinstance(self.ctx, int) else (self.ctx.min + self.ctx.max) / 2

    def mean_ctx_exact(self) -> Fraction:
        """`mean_ctx` without float rounding (a context above 2^53 stays exact): what the cost counts."""
        return Fraction(self.ctx) if isinstance(self.ctx, int) else Fraction(self.ctx.min + self.ctx.max, 2)


def _ctx_label(g: BatchGroup) -> str:
    return str(g.ctx) if isinstance(g.ctx, int) else f"{g.ctx.min}-{g.ctx.max}"


class Batch(SpecModel):
    groups: list[BatchGroup] = Field(min_length=1)
    pages: Literal["contiguous", "shuffled"] = "contiguous"
    seed: Int64 = 0

    def requests(self) -> int:
        return sum(g.count for g in self.groups)

    def label(self) -> str:
        """`8x(q1,ctx8192)+1x(q512,ctx0)`."""
        return "+".join(f"{g.count}x(q{g.q},ctx{_ctx_label(g)})" for g in self.groups)

    def shape_label(self) -> str:
        """The label with the counts left out (`Mx(q1,ctx8192)`; groups after the first keep their count)."""
        first, *rest = self.groups
        return "+".join([f"Mx(q{first.q},ctx{_ctx_label(first)})",
                         *(f"{g.count}x(q{g.q},ctx{_ctx_label(g)})" for g in rest)])


class ProjOperands(SpecModel):
    a: Operand
    b: Operand


class RopeScaling(SpecModel):
    type: Literal["yarn"]
    factor: PositiveFloat
    original_max: Size
    beta_fast: Optional[PositiveFloat] = None
    beta_slow: Optional[PositiveFloat] = None
    mscale: Optional[PositiveFloat] = None
    mscale_all_dim: Optional[PositiveFloat] = None


class AttentionArgs(OpArgs):
    """What every attention type shares; subclasses add their module's sizes."""

    FAMILY = "attention"
    SIZE_AXIS = "batch"
    IMPLEMENTED = False
    TYPE: ClassVar[str] = ""
    PROJECTIONS: ClassVar[tuple[str, ...]] = ()
    #: The head counts tp divides, as vLLM's module splits them (rank_shard); () = no shard yet.
    SHARDED_HEADS: ClassVar[tuple[str, ...]] = ()

    hidden: Size
    batch: Batch
    proj: Optional[dict[str, ProjOperands]] = None
    parallel: Optional[Parallel] = None

    @field_validator("parallel")
    @classmethod
    def _attention_axes(cls, parallel: Optional[Parallel]) -> Optional[Parallel]:
        return check_family_axes(parallel, "attention")

    @field_validator("proj")
    @classmethod
    def _known_projections(cls, proj: Optional[dict[str, ProjOperands]]) -> Optional[dict[str, ProjOperands]]:
        for name in proj or {}:
            if name not in cls.PROJECTIONS:
                raise ValueError(f"{name}: not a projection of {cls.TYPE} (its projections: "
                                 f"{', '.join(cls.PROJECTIONS)})")
        return proj

    def label(self) -> str:
        return f"{self.TYPE} H={self.hidden} {self.heads_label()} {self.batch.label()}{self.split_label()}"

    def heads_label(self) -> str:
        """The module's head sizes in short (`32q/4kv×128`), so two models of one hidden size never share
        a label or a Shape-page family."""
        raise NotImplementedError

    def size(self) -> int:
        return self.batch.requests()

    def family(self) -> str:
        """Everything but the request counts: one line per module and (q, ctx) of each group, plotted
        against the batch (`Mx(q1,ctx8192)`)."""
        return f"{self.TYPE} H={self.hidden} {self.heads_label()} {self.batch.shape_label()}{self.split_label()}"

    def scheme(self) -> str:
        """`bf16`, or the first quantized projection's weight scheme."""
        for pair in (self.proj or {}).values():
            if pair.b.dtype != "bf16":
                return pair.b.scheme_name()
        return "bf16"

    def peak_dtypes(self) -> tuple[str, str]:
        for pair in (self.proj or {}).values():
            if pair.b.dtype != "bf16":
                return pair.a.dtype, pair.b.dtype
        return "bf16", "bf16"

    def cost(self) -> AttentionCost:
        """One call's FLOPs and fewest bytes by part, for the whole module as the args write it.

        `parallel` leaves the count alone, as gemm's and moe's: tp and dcp share this work over
        ranks (the heads, the cache), and with dp the batch here is one dp group's, as moe's `tokens`.
        A ctx range counts at its mean (BatchGroup.mean_ctx).
        """
        tally = CostTally(sum(g.count * g.q for g in self.batch.groups), self.hidden)
        self._add_cost(tally)
        return tally.result()

    def cost_parts(self) -> dict[str, int]:
        c = self.cost()
        return {"projection_flops": c.projection_flops, "attention_flops": c.attention_flops,
                "projection_bytes": c.projection_bytes, "cache_bytes": c.cache_bytes, "state_bytes": c.state_bytes}

    def _add_cost(self, tally: CostTally) -> None:
        raise NotImplementedError

    def rank_shard(self, sources: Sequence[str] = (), shapes: LayerShapes = NO_LAYER_SHAPES) -> tuple[OpArgs, str]:
        """One rank's module: each SHARDED_HEADS count over tp (_heads_shard), the whole hidden size in and
        out (the output projection's all-reduce left out); a type with no SHARDED_HEADS has no shard yet."""
        if not self.SHARDED_HEADS:
            return super().rank_shard(sources, shapes)
        if self.parallel is None:
            return self, "one device: the whole module"
        data, moved = _heads_shard(self, {name: getattr(self, name) for name in self.SHARDED_HEADS})
        return type(self).model_validate(data), f"heads tensor-parallel over {self.parallel.tp}: {', '.join(moved)}"

    def flops(self) -> int:
        """cost().flops: the projections plus the attention over each request's context."""
        return self.cost().flops

    def min_bytes(self) -> int:
        """cost().bytes: weights, the module's input and output, cache and state, each moved once."""
        return self.cost().bytes

    def _groups(self) -> list[tuple[int, int, Fraction]]:
        """(count, q, mean ctx) of each batch group."""
        return [(g.count, g.q, g.mean_ctx_exact()) for g in self.batch.groups]

    def _linear(self, tally: CostTally, name: str, in_features: int, out_features: int) -> None:
        pair = (self.proj or {}).get(name)
        tally.linear(pair.b if pair is not None else None, in_features, out_features)


def _positive_theta(rope: bool, theta: Optional[float], scaling: Optional[RopeScaling]) -> None:
    if rope and theta is None:
        raise ValueError("rope_theta: required when rope is on")
    if not rope and (theta is not None or scaling is not None):
        raise ValueError("rope_theta / rope_scaling: only with rope")


def _heads_shard(args: AttentionArgs, heads: dict[str, int]) -> tuple[dict[str, Any], list[str]]:
    """The shard's args data with `parallel` dropped and each named head count cut over tp, and what moved.

    tp splits the heads as vLLM's attention modules do (QKVParallelLinear: q heads / tp; KV heads /
    tp, or one replicated KV head per rank when tp exceeds them); dp leaves the batch alone (the
    case's batch is one dp group's, as moe's `tokens`); dcp splits each request's cache over ranks
    whose partial softmaxes are merged by a collective: no one-rank shard.
    """
    p = args.parallel
    assert p is not None
    if p.dcp > 1:
        raise ShardRefused(f"dcp={p.dcp}: each rank attends 1/{p.dcp} of every context and the ranks merge their "
                           "partial softmaxes; one rank's share is no single attention case")
    data = args.model_dump(mode="json", exclude_none=True)
    data.pop("parallel", None)
    moved: list[str] = []
    for field, total in heads.items():
        if field == "kv_heads" and total < p.tp:
            if p.tp % total:
                raise ShardRefused(f"kv_heads={total} does not divide tp={p.tp} (vLLM replicates KV heads only then)")
            data[field] = 1
            moved.append(f"kv_heads {total} -> 1 (each KV head replicated on {p.tp // total} ranks)")
            continue
        data[field] = divide(total, p.tp, field)
        moved.append(f"{field} {total} -> {data[field]}")
    if p.dp > 1:
        moved.append(f"batch as written (one of the {p.dp} dp groups)")
    return data, moved


class _GroupedHeads(AttentionArgs):
    """Query heads sharing KV heads, with RoPE on the first rope_dim dims (M-RoPE with mrope_section)."""

    q_heads: Size
    kv_heads: Size
    head_dim: Size
    rope_dim: Size
    rope_theta: PositiveFloat
    mrope_section: Optional[list[Count]] = None

    @model_validator(mode="after")
    def _heads(self) -> _GroupedHeads:
        if self.q_heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} does not divide q_heads={self.q_heads}")
        if self.rope_dim > self.head_dim:
            raise ValueError(f"rope_dim={self.rope_dim} exceeds head_dim={self.head_dim}")
        m = self.mrope_section
        if m is not None and (len(m) != 3 or 2 * sum(m) != self.rope_dim):
            raise ValueError(f"mrope_section: three sizes covering rope_dim/2 = {self.rope_dim // 2}")
        return self

    def heads_label(self) -> str:
        return f"{self.q_heads}q/{self.kv_heads}kv×{self.head_dim}"

    def _add_heads(self, tally: CostTally, q_out: int, cap: Optional[int], kv_element_bytes: int,
                   read_cap: Optional[int]) -> None:
        """q/k/v/o projections, QKᵀ + PV over head_dim for every attended key, the K and V cache.

        `cap` caps the keys one token attends; `read_cap` the cached tokens a request reads.
        """
        h, d = self.hidden, self.head_dim
        kv = self.kv_heads * d
        self._linear(tally, "q_proj", h, q_out)
        self._linear(tally, "k_proj", h, kv)
        self._linear(tally, "v_proj", h, kv)
        self._linear(tally, "o_proj", self.q_heads * d, h)
        per_token = 2 * kv * kv_element_bytes                       # K and V of one token
        for count, q, ctx in self._groups():
            tally.attention_flops += count * 4 * self.q_heads * d * attended(ctx, q, cap)
            read = ctx if read_cap is None else min(ctx, Fraction(read_cap))
            tally.cache_bytes += count * (read + q) * per_token


def _with_state(label: str, state_dtype: str) -> str:
    """A linear-attention label with its recurrent state's dtype where it is not the default fp32."""
    return label if state_dtype == "fp32" else f"{label} state:{state_dtype}"


class GqaArgs(_GroupedHeads):
    """Dense grouped-query attention: q/k/v projections, optional q/k norm, RoPE, cache write,
    causal attention, optional sigmoid output gate, o_proj."""

    TYPE = "gqa"
    IMPLEMENTED = True
    #: q heads / tp; KV heads / tp, or one replicated per rank when tp exceeds them.
    SHARDED_HEADS = ("q_heads", "kv_heads")
    PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
    qk_norm: bool = False
    gate: bool = False
    window: Optional[Size] = None
    kv_cache_dtype: Literal["auto", "bf16", "fp8"] = "auto"

    def heads_label(self) -> str:
        """`32q/8kv×128`, then what else changes the work: `qk-norm`, `gated`, `w<window>`."""
        marks = [mark for on, mark in ((self.qk_norm, "qk-norm"), (self.gate, "gated"),
                                       (self.window is not None, f"w{self.window}")) if on]
        return " ".join([super().heads_label(), *marks])

    def _add_cost(self, tally: CostTally) -> None:
        """The gate doubles q_proj's output (packed in, as Qwen3.5); a window of W caps each token at
        W keys (itself and the W-1 before it), so a request reads at most W-1 cached tokens."""
        q_out = self.q_heads * self.head_dim * (2 if self.gate else 1)
        read_cap = self.window - 1 if self.window is not None else None
        self._add_heads(tally, q_out, self.window, _KV_ELEMENT_BYTES[self.kv_cache_dtype], read_cap)


class QsaArgs(_GroupedHeads):
    """Gated sparse attention (Qwen3.8-Flash-Next): GQA whose attention reads the tokens an indexer picks."""

    TYPE = "qsa"
    MISSING = "no backend builds gated sparse attention's indexer and budgeted selection (vLLM 0.26 has no module)"
    PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "indexer.index_qk_proj")
    index_heads: Size
    index_dim: Size
    compress: Size
    budget: Size
    selection: Selection = "natural"

    @model_validator(mode="after")
    def _budget(self) -> QsaArgs:
        if self.budget % self.compress:
            raise ValueError(f"compress={self.compress} does not divide budget={self.budget}")
        return self

    def _add_cost(self, tally: CostTally) -> None:
        """GQA with the gate always in q_proj, attention over at most `budget` tokens of a bf16 cache;
        the indexer projects index_heads queries and one key, scores every compressed key (one per
        `compress` tokens) and keeps a bf16 compressed index-K cache (the format names no dtype)."""
        self._add_heads(tally, 2 * self.q_heads * self.head_dim, self.budget, 2, self.budget)
        ih, idim = self.index_heads, self.index_dim
        self._linear(tally, "indexer.index_qk_proj", self.hidden, (ih + 1) * idim)
        for count, q, ctx in self._groups():
            tally.attention_flops += count * 2 * ih * idim * attended(ctx, q, ratio=self.compress)
            tally.cache_bytes += count * (ctx + q) / self.compress * idim * 2


class _LatentHeads(AttentionArgs):
    """MLA's sizes: heads over a low-rank q and a kv latent, nope + rope query/key dims, v dims."""

    heads: Size
    q_lora_rank: Size
    kv_lora_rank: Size
    nope: Size
    rope_dim: Size
    v: Size

    def heads_label(self) -> str:
        return f"{self.heads}h r{self.kv_lora_rank}"

    def _latent_bytes(self, kv_cache_dtype: str) -> int:
        """Bytes of one cached token's latent (kv_lora_rank) and rope key (rope_dim).

        fp8_ds_mla is vLLM's sparse-MLA layout: the latent in fp8 with one fp32 scale per 128,
        the rope part kept bf16.
        """
        r, rope = self.kv_lora_rank, self.rope_dim
        if kv_cache_dtype == "fp8_ds_mla":
            return r + 4 * ceil(r / 128) + 2 * rope
        return (r + rope) * _KV_ELEMENT_BYTES[kv_cache_dtype]

    def _add_latent(self, tally: CostTally, cap: Optional[int], kv_cache_dtype: str) -> None:
        """MLA's projections, attention and latent cache; `cap` (DSA's topk) caps the attended keys.

        kv_b_proj counts over the new tokens: vLLM's decode form folds it into q (W_UK) and the
        output (W_UV), the same 2·T·kv_lora_rank·heads·(nope + v); the prefill form also runs it over
        the new tokens' latents. Per request the attention counts in the cheaper of vLLM's two forms:
        absorbed (MQA over the latent: QKᵀ over kv_lora_rank + rope_dim, PV over kv_lora_rank) or
        up-projected (kv_b_proj over the cached latents, then MHA: QKᵀ over nope + rope_dim, PV over
        v), so a row's TFLOP/s never counts work the cheaper path vLLM has would not do.
        """
        h, heads, r = self.hidden, self.heads, self.kv_lora_rank
        qk, up = self.nope + self.rope_dim, heads * (self.nope + self.v)
        self._linear(tally, "q_a_proj", h, self.q_lora_rank)
        self._linear(tally, "kv_a_proj_with_mqa", h, r + self.rope_dim)
        self._linear(tally, "q_b_proj", self.q_lora_rank, heads * qk)
        self._linear(tally, "kv_b_proj", r, up)
        self._linear(tally, "o_proj", heads * self.v, h)
        per_token = self._latent_bytes(kv_cache_dtype)
        for count, q, ctx in self._groups():
            keys = attended(ctx, q, cap)
            read = ctx if cap is None else min(ctx, Fraction(cap))
            absorbed = 2 * heads * (2 * r + self.rope_dim) * keys
            up_projected = 2 * heads * (qk + self.v) * keys + 2 * read * r * up
            tally.attention_flops += count * min(absorbed, up_projected)
            tally.cache_bytes += count * (read + q) * per_token


class MlaArgs(_LatentHeads):
    """DeepSeek multi-head latent attention: low-rank q and kv, a latent cache, o_proj."""

    TYPE = "mla"
    IMPLEMENTED = True
    #: The q and kv latents (q_a_proj, kv_a_proj_with_mqa) and the latent cache stay whole on every
    #: rank, as vLLM replicates them.
    SHARDED_HEADS = ("heads",)
    PROJECTIONS = ("q_a_proj", "kv_a_proj_with_mqa", "q_b_proj", "kv_b_proj", "o_proj", "g_proj")
    rope: bool = True
    rope_theta: Optional[PositiveFloat] = None
    rope_scaling: Optional[RopeScaling] = None
    gate: bool = False
    kv_cache_dtype: Literal["auto", "bf16", "fp8"] = "auto"

    @model_validator(mode="after")
    def _rope(self) -> MlaArgs:
        _positive_theta(self.rope, self.rope_theta, self.rope_scaling)
        if not self.gate and self.proj and "g_proj" in self.proj:
            raise ValueError("proj.g_proj: only with gate")
        return self

    def _add_cost(self, tally: CostTally) -> None:
        """Dense MLA over every cached token; the output gate (Kimi-K3) is one more projection,
        hidden -> heads·v (assumed as vLLM's KDA g_proj: one gate value per output element)."""
        self._add_latent(tally, None, self.kv_cache_dtype)
        if self.gate:
            self._linear(tally, "g_proj", self.hidden, self.heads * self.v)


class MlaDsaArgs(_LatentHeads):
    """MLA with DeepSeek sparse attention (an indexer picks topk cached tokens)."""

    TYPE = "mla_dsa"
    IMPLEMENTED = True
    #: As mla; the indexer stays whole on every rank too (vLLM builds its wq_b replicated: index_heads
    #: and the index-key cache are every rank's).
    SHARDED_HEADS = ("heads",)
    PROJECTIONS = ("q_a_proj", "kv_a_proj_with_mqa", "q_b_proj", "kv_b_proj", "o_proj",
                   "indexer.wq_b", "indexer.wk", "indexer.weights_proj")
    rope_theta: PositiveFloat
    topk: Size
    index_heads: Size
    index_dim: Size
    indexer: Literal["own", "reuse"] = "own"
    rope_scaling: Optional[RopeScaling] = None
    kv_cache_dtype: Literal["auto", "bf16", "fp8", "fp8_ds_mla"] = "auto"
    selection: Selection = "natural"

    @model_validator(mode="after")
    def _reuse_has_no_indexer(self) -> MlaDsaArgs:
        if self.indexer == "reuse":
            named = sorted(name for name in (self.proj or {}) if name.startswith("indexer."))
            if named:
                raise ValueError(f"proj.{named[0]}: an `indexer: reuse` layer runs no indexer (it reads an earlier "
                                 "layer's top-k)")
        return self

    def heads_label(self) -> str:
        """As mla's, with `reuse` for a layer that reads an earlier layer's top-k (its label would match the
        own-indexer layer's otherwise)."""
        label = super().heads_label()
        return f"{label} reuse" if self.indexer == "reuse" else label

    def _add_cost(self, tally: CostTally) -> None:
        """MLA over at most topk selected tokens. An own indexer projects index_heads queries
        (from the q latent), one key and the head weights, scores every key of the context and keeps
        an fp8 index-K cache (index_dim bytes and one fp32 scale per 128); `reuse` reads an earlier
        layer's top-k (int32 indices) instead."""
        self._add_latent(tally, self.topk, self.kv_cache_dtype)
        ih, idim = self.index_heads, self.index_dim
        if self.indexer == "reuse":
            tally.cache_bytes += tally.tokens * self.topk * _INDEX_BYTES
            return
        self._linear(tally, "indexer.wq_b", self.q_lora_rank, ih * idim)
        self._linear(tally, "indexer.wk", self.hidden, idim)
        self._linear(tally, "indexer.weights_proj", self.hidden, ih)
        per_key = idim + 4 * ceil(idim / 128)
        for count, q, ctx in self._groups():
            tally.attention_flops += count * 2 * ih * idim * attended(ctx, q)
            tally.cache_bytes += count * (ctx + q) * per_key


class Dsv4AttnArgs(AttentionArgs):
    """DeepSeek-V4 attention: a sliding window of raw tokens plus compressed tokens (compressor,
    optional indexer), one latent as K and V, grouped low-rank output."""

    TYPE = "dsv4_attn"
    IMPLEMENTED = True
    PROJECTIONS = ("wq_a", "wkv", "wq_b", "wo_a", "wo_b", "compressor.wkv", "compressor.wgate",
                   "indexer.wq_b", "indexer.wk", "indexer.weights_proj",
                   "indexer.compressor.wkv", "indexer.compressor.wgate")
    #: vLLM's DeepseekV4Attention splits both over tp (n_local_heads, n_local_groups: wq_b and wo_a column-parallel,
    #: wo_b row-parallel) and replicates wq_a / wkv, the compressor and the indexer (index_heads stay whole).
    SHARDED_HEADS = ("heads", "o_groups")
    heads: Size
    head_dim: Size
    rope_dim: Size
    q_lora_rank: Size
    window: Size
    o_groups: Size
    o_lora_rank: Size
    compress_ratio: Literal[0, 1, 2, 4, 128]
    source: bool = True
    indexer: Optional[Literal["own", "shared", "reuse"]] = None
    topk: Optional[Size] = None
    index_heads: Optional[Size] = None
    index_dim: Optional[Size] = None
    rope_theta: PositiveFloat = 10000.0
    compress_rope_theta: Optional[PositiveFloat] = None
    rope_scaling: Optional[RopeScaling] = None
    kv_cache_dtype: Literal["auto", "bf16", "fp8", "fp8_ds_mla"] = "auto"
    index_cache_dtype: Optional[Literal["fp8", "mxfp4"]] = None
    selection: Selection = "natural"

    @model_validator(mode="after")
    def _layer_kind(self) -> Dsv4AttnArgs:
        if self.heads % self.o_groups:
            raise ValueError(f"o_groups={self.o_groups} does not divide heads={self.heads}")
        if self.compress_ratio in (0, 128) and self.indexer is not None:
            raise ValueError(f"indexer: compress_ratio {self.compress_ratio} has none")
        if self.compress_ratio == 4 and self.indexer != "own":
            raise ValueError("indexer: compress_ratio 4 runs its own")
        if self.compress_ratio == 0 and not self.source:
            raise ValueError("source: a window-only layer has no compressed cache to share")
        index = (self.topk, self.index_heads, self.index_dim)
        if self.indexer is None and (any(v is not None for v in index) or self.index_cache_dtype is not None):
            raise ValueError("topk / index_heads / index_dim / index_cache_dtype: only with an indexer")
        if self.indexer is not None and any(v is None for v in index):
            raise ValueError("topk, index_heads and index_dim: required with an indexer")
        if self.compress_ratio and self.compress_rope_theta is None:
            raise ValueError("compress_rope_theta: required when compress_ratio > 0")
        if not self.compress_ratio and (self.compress_rope_theta is not None or self.rope_scaling is not None):
            raise ValueError("compress_rope_theta / rope_scaling: only when compress_ratio > 0")
        return self

    def heads_label(self) -> str:
        """`128h×512 w128 c4`, then the indexer where it is not the layer's only kind (`shared`, `reuse`,
        `src0` for a layer that reads another's cache) and an index cache other than fp8, so no two layer
        kinds of one model share a label."""
        parts = [f"{self.heads}h×{self.head_dim} w{self.window} c{self.compress_ratio}"]
        if self.indexer in ("shared", "reuse"):
            parts.append(self.indexer)
        if not self.source:
            parts.append("src0")
        if self.index_cache_dtype not in (None, "fp8"):
            parts.append(f"idx:{self.index_cache_dtype}")
        return " ".join(parts)

    def _cache_token_bytes(self) -> int:
        """One cached token (raw or compressed): bf16 head_dim, or vLLM's fp8 V4 layout for every
        other dtype (auto included: vLLM runs V4 on that layout only): the nope part in fp8, one
        ue8m0 scale byte per 64 and a pad byte, the rope part bf16."""
        if self.kv_cache_dtype == "bf16":
            return 2 * self.head_dim
        nope = self.head_dim - self.rope_dim
        return nope + ceil(nope / 64) + 1 + 2 * self.rope_dim

    def _index_key_bytes(self) -> int:
        """One index key: fp8 with one fp32 scale (default), or mxfp4 with one byte per 32."""
        idim = self.index_dim or 0
        return idim // 2 + ceil(idim / 32) if self.index_cache_dtype == "mxfp4" else idim + 4 * ceil(idim / 128)

    def _add_cost(self, tally: CostTally) -> None:
        """Window + compressed MQA, K = V = one head_dim latent.

        Each token attends its window (itself and W-1 before it) and the compressed entries (one per
        compress_ratio tokens; at most topk with an indexer; none at ratio 0). QKᵀ and PV both run
        over head_dim. wo_a is grouped: o_groups blocks of heads/o_groups heads, each to o_lora_rank.
        The compressor (ratio > 0, source) projects kv and gate, coff·head_dim each (coff 2 at ratio 4:
        overlapping windows, as V4-Pro; else 1), and keeps an fp32 state of kv + score per token,
        written once and read coff times as its windows pool. The indexer (own / shared) scores every
        compressed key with index_heads queries.
        """
        h, heads, hd, r = self.hidden, self.heads, self.head_dim, self.compress_ratio
        coff = 2 if r == 4 else 1
        self._linear(tally, "wq_a", h, self.q_lora_rank)
        self._linear(tally, "wkv", h, hd)
        self._linear(tally, "wq_b", self.q_lora_rank, heads * hd)
        self._linear(tally, "wo_a", heads * hd // self.o_groups, self.o_groups * self.o_lora_rank)
        self._linear(tally, "wo_b", self.o_groups * self.o_lora_rank, h)
        compressor = r > 0 and self.source
        if compressor:
            self._linear(tally, "compressor.wkv", h, coff * hd)
            self._linear(tally, "compressor.wgate", h, coff * hd)
            tally.state_bytes += tally.tokens * 2 * coff * hd * 4 * (1 + coff)
        ih, idim, topk = self.index_heads or 0, self.index_dim or 0, self.topk
        if self.indexer in ("own", "shared"):
            self._linear(tally, "indexer.wq_b", self.q_lora_rank, ih * idim)
            self._linear(tally, "indexer.weights_proj", h, ih)
        if self.indexer == "own" and r == 4:
            self._linear(tally, "indexer.compressor.wkv", h, coff * idim)
            self._linear(tally, "indexer.compressor.wgate", h, coff * idim)
            tally.state_bytes += tally.tokens * 2 * coff * idim * 4 * (1 + coff)
        elif self.indexer == "own":
            self._linear(tally, "indexer.wk", hd, idim)
        if self.indexer == "reuse" and topk is not None:
            tally.cache_bytes += tally.tokens * topk * _INDEX_BYTES
        per_token = self._cache_token_bytes()
        for count, q, ctx in self._groups():
            keys = attended(ctx, q, self.window)
            moved = min(ctx, Fraction(self.window - 1)) + q          # window: read, and the new tokens written
            if r:
                keys += attended(ctx, q, topk, ratio=r)
                moved += ctx / r if topk is None else min(ctx / r, Fraction(topk))
                moved += Fraction(q, r) if compressor else 0
            tally.attention_flops += count * 4 * heads * hd * keys
            tally.cache_bytes += count * moved * per_token
            if self.indexer in ("own", "shared"):
                tally.attention_flops += count * 2 * ih * idim * attended(ctx, q, ratio=r)
                written = Fraction(q, r) if self.indexer == "own" else Fraction(0)
                tally.cache_bytes += count * (ctx / r + written) * self._index_key_bytes()


class GdnArgs(AttentionArgs):
    """Gated DeltaNet linear attention: projections, causal conv, delta rule over a recurrent state."""

    TYPE = "gdn"
    IMPLEMENTED = True
    #: Both divide exactly; the conv and recurrent states are the rank's heads'.
    SHARDED_HEADS = ("qk_heads", "v_heads")
    PROJECTIONS = ("in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b", "out_proj")
    qk_heads: Size
    v_heads: Size
    head_dim: Size
    conv_kernel: Size
    norm_act: Literal["silu", "sigmoid"] = "silu"
    state_dtype: StateDType = "fp32"

    def heads_label(self) -> str:
        """`16qk/32v×128`, with the state dtype when it is not fp32."""
        return _with_state(f"{self.qk_heads}qk/{self.v_heads}v×{self.head_dim}", self.state_dtype)

    @model_validator(mode="after")
    def _heads(self) -> GdnArgs:
        if self.v_heads % self.qk_heads:
            raise ValueError(f"qk_heads={self.qk_heads} does not divide v_heads={self.v_heads}")
        return self

    def _add_cost(self, tally: CostTally) -> None:
        """q and k over qk_heads, v, z (the norm's gate) over v_heads, a and b one value per v head;
        the conv runs over q, k and v; the state is v_heads x head_dim x head_dim."""
        h, d, kd, vd = self.hidden, self.head_dim, self.qk_heads * self.head_dim, self.v_heads * self.head_dim
        self._linear(tally, "in_proj_qkv", h, 2 * kd + vd)
        self._linear(tally, "in_proj_z", h, vd)
        self._linear(tally, "in_proj_a", h, self.v_heads)
        self._linear(tally, "in_proj_b", h, self.v_heads)
        self._linear(tally, "out_proj", vd, h)
        _add_recurrence(self, tally, 2 * kd + vd, self.v_heads, d, self.conv_kernel, self.state_dtype)


class KdaArgs(AttentionArgs):
    """Kimi Delta Attention: gated delta rule with a per-channel decay of rank gate_rank."""

    TYPE = "kda"
    MISSING = ("vLLM 0.26 has no module with Kimi-K3's full-rank output gate (its KimiGatedDeltaNetAttention is "
               "Kimi-Linear's, low rank)")
    PROJECTIONS = ("q_proj", "k_proj", "v_proj", "g_proj", "f_a_proj", "f_b_proj", "b_proj", "o_proj")
    heads: Size
    head_dim: Size
    conv_kernel: Size
    gate_rank: Optional[Size] = None
    state_dtype: StateDType = "fp32"

    def heads_label(self) -> str:
        """`96h×128`, with the state dtype when it is not fp32."""
        return _with_state(f"{self.heads}h×{self.head_dim}", self.state_dtype)

    def _add_cost(self, tally: CostTally) -> None:
        """q, k, v and the output gate g over heads·head_dim; the decay through f_a (hidden -> gate_rank,
        head_dim when unset, as vLLM's Kimi Linear) and f_b; b one value per head; conv over q, k, v."""
        h, p = self.hidden, self.heads * self.head_dim
        rank = self.gate_rank if self.gate_rank is not None else self.head_dim
        for name in ("q_proj", "k_proj", "v_proj", "g_proj"):
            self._linear(tally, name, h, p)
        self._linear(tally, "f_a_proj", h, rank)
        self._linear(tally, "f_b_proj", rank, p)
        self._linear(tally, "b_proj", h, self.heads)
        self._linear(tally, "o_proj", p, h)
        _add_recurrence(self, tally, 3 * p, self.heads, self.head_dim, self.conv_kernel, self.state_dtype)


def _add_recurrence(args: AttentionArgs, tally: CostTally, conv_dim: int, heads: int, d: int, kernel: int,
                    state_dtype: str) -> None:
    """Linear attention's causal depthwise conv and delta rule, with their per-request state.

    Conv: 2·conv_kernel FLOPs per channel and token. Delta rule, per token and head, on a
    head_dim x head_dim state S: decay S (d² multiplies), read Sᵀk (2d²), the rank-1 update (2d²),
    read Sᵀq (2d²): 7d², the recurrent form (the chunked prefill does the same product reorganised).
    State: each request's S (heads·d² in state_dtype) and conv state ((conv_kernel - 1)·conv_dim,
    bf16) written once, and read once when the request has a context (ctx 0 starts from zeros).
    """
    tally.attention_flops += tally.tokens * (2 * conv_dim * kernel + 7 * heads * d * d)
    per_request = heads * d * d * _STATE_BYTES[state_dtype] + (kernel - 1) * conv_dim * _CONV_STATE_BYTES
    for count, _q, ctx in args._groups():
        tally.state_bytes += count * per_request * (2 if ctx > 0 else 1)


#: Every attention op type upstream defines, by its `type`.
ATTENTION_TYPES: dict[str, type[AttentionArgs]] = {
    cls.TYPE: cls for cls in (GqaArgs, QsaArgs, MlaArgs, MlaDsaArgs, Dsv4AttnArgs, GdnArgs, KdaArgs)}
