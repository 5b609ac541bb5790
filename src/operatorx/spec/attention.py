"""Attention op types as upstream OperatorX spells them: gqa, qsa, mla, mla_dsa, dsv4_attn, gdn, kda.

Each times one attention module whole, from the post-norm hidden states [T, hidden] to the module
output before the residual add, over a KV cache (or linear-attention state) filled for every
request's context. This version validates these cases field by field, so a file that holds them
loads and a malformed one is refused with its field, but it has no backend for them yet: their rows
read `unsupported: op type ... is not implemented yet` (IMPLEMENTED = False).

Shared fields:
- `batch`: `groups` of `count` requests with `q` new tokens each over `ctx` cached ones (an int, or
  `{dist: uniform, min, max}` drawn per request from `seed`); `pages` contiguous or shuffled.
- `proj`: `{module: {a, b}}` gemm operand descriptors per projection; a projection left out is bf16.
- `kv_cache_dtype`: the serving engine's `--kv-cache-dtype` (auto = the model dtype).
"""

from __future__ import annotations

from typing import ClassVar, Literal, Optional, Union

from pydantic import Field, PositiveFloat, field_validator, model_validator

from operatorx.spec.base import Count, Int64, Size, SpecModel
from operatorx.spec.op_type import OpArgs
from operatorx.spec.operand import Operand
from operatorx.spec.parallel import Parallel, check_family_axes

__all__ = ["ATTENTION_TYPES", "AttentionArgs", "Batch", "BatchGroup", "CtxRange", "ProjOperands", "RopeScaling"]

Selection = Literal["natural", "uniform", "recent", "clustered"]
StateDType = Literal["fp32", "bf16"]


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


class Batch(SpecModel):
    groups: list[BatchGroup] = Field(min_length=1)
    pages: Literal["contiguous", "shuffled"] = "contiguous"
    seed: Int64 = 0

    def requests(self) -> int:
        return sum(g.count for g in self.groups)

    def label(self) -> str:
        """`8x(q1,ctx8192)+1x(q512,ctx0)`."""
        def ctx(g: BatchGroup) -> str:
            return str(g.ctx) if isinstance(g.ctx, int) else f"{g.ctx.min}-{g.ctx.max}"
        return "+".join(f"{g.count}x(q{g.q},ctx{ctx(g)})" for g in self.groups)


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
        return f"{self.TYPE} H={self.hidden} {self.batch.label()}{self.split_label()}"

    def size(self) -> int:
        return self.batch.requests()

    def family(self) -> str:
        return f"{self.TYPE} H={self.hidden}{self.split_label()}"

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

    def flops(self) -> int:
        """Not derived until the type is implemented: a planned case is never measured, so 0 orders it first."""
        return 0

    def min_bytes(self) -> int:
        return 0


def _positive_theta(rope: bool, theta: Optional[float], scaling: Optional[RopeScaling]) -> None:
    if rope and theta is None:
        raise ValueError("rope_theta: required when rope is on")
    if not rope and (theta is not None or scaling is not None):
        raise ValueError("rope_theta / rope_scaling: only with rope")


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


class GqaArgs(_GroupedHeads):
    """Dense grouped-query attention: q/k/v projections, optional q/k norm, RoPE, cache write,
    causal attention, optional sigmoid output gate, o_proj."""

    TYPE = "gqa"
    PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
    qk_norm: bool = False
    gate: bool = False
    window: Optional[Size] = None
    kv_cache_dtype: Literal["auto", "bf16", "fp8"] = "auto"


class QsaArgs(_GroupedHeads):
    """Gated sparse attention (Qwen3.8-Flash-Next): GQA whose attention reads the tokens an indexer picks."""

    TYPE = "qsa"
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


class _LatentHeads(AttentionArgs):
    """MLA's sizes: heads over a low-rank q and a kv latent, nope + rope query/key dims, v dims."""

    heads: Size
    q_lora_rank: Size
    kv_lora_rank: Size
    nope: Size
    rope_dim: Size
    v: Size


class MlaArgs(_LatentHeads):
    """DeepSeek multi-head latent attention: low-rank q and kv, a latent cache, o_proj."""

    TYPE = "mla"
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


class MlaDsaArgs(_LatentHeads):
    """MLA with DeepSeek sparse attention (an indexer picks topk cached tokens)."""

    TYPE = "mla_dsa"
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


class Dsv4AttnArgs(AttentionArgs):
    """DeepSeek-V4 attention: a sliding window of raw tokens plus compressed tokens (compressor,
    optional indexer), one latent as K and V, grouped low-rank output."""

    TYPE = "dsv4_attn"
    PROJECTIONS = ("wq_a", "wkv", "wq_b", "wo_a", "wo_b", "compressor.wkv", "compressor.wgate",
                   "indexer.wq_b", "indexer.wk", "indexer.weights_proj",
                   "indexer.compressor.wkv", "indexer.compressor.wgate")
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


class GdnArgs(AttentionArgs):
    """Gated DeltaNet linear attention: projections, causal conv, delta rule over a recurrent state."""

    TYPE = "gdn"
    PROJECTIONS = ("in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b", "out_proj")
    qk_heads: Size
    v_heads: Size
    head_dim: Size
    conv_kernel: Size
    norm_act: Literal["silu", "sigmoid"] = "silu"
    state_dtype: StateDType = "fp32"

    @model_validator(mode="after")
    def _heads(self) -> GdnArgs:
        if self.v_heads % self.qk_heads:
            raise ValueError(f"qk_heads={self.qk_heads} does not divide v_heads={self.v_heads}")
        return self


class KdaArgs(AttentionArgs):
    """Kimi Delta Attention: gated delta rule with a per-channel decay of rank gate_rank."""

    TYPE = "kda"
    PROJECTIONS = ("q_proj", "k_proj", "v_proj", "g_proj", "f_a_proj", "f_b_proj", "b_proj", "o_proj")
    heads: Size
    head_dim: Size
    conv_kernel: Size
    gate_rank: Optional[Size] = None
    state_dtype: StateDType = "fp32"


#: Every attention op type upstream defines, by its `type`.
ATTENTION_TYPES: dict[str, type[AttentionArgs]] = {
    cls.TYPE: cls for cls in (GqaArgs, QsaArgs, MlaArgs, MlaDsaArgs, Dsv4AttnArgs, GdnArgs, KdaArgs)}
