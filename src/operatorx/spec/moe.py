"""`moe` args: one MoE layer from the router GEMM to the combined output."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal, Optional, Union

from pydantic import Field, PositiveFloat, field_validator, model_validator

from operatorx.spec.base import Count, Size, SpecModel
from operatorx.spec.dtypes import ELEMENT_BITS, OutDType
from operatorx.spec.op_type import OpArgs
from operatorx.spec.operand import Operand, check_group
from operatorx.spec.parallel import Parallel, check_family_axes
from operatorx.spec.shard import NO_LAYER_SHAPES, LayerShapes, ShardRefused, divide

__all__ = [
    "MoeArgs", "Experts", "Router", "Gate", "TopK", "GroupedTopK", "HashSelect",
    "Activation", "Shared", "Routing", "Zipf",
]

_BF16 = Operand(dtype="bf16")


class Experts(SpecModel):
    num: Size
    top_k: Size
    inter: Size
    a1: Operand = _BF16
    w1: Operand
    w2: Operand
    a2: Operand = _BF16
    bias: Optional[bool] = None
    latent: Optional[Size] = None
    latent_norm: Optional[bool] = None
    zero: Optional[Count] = None
    local: Optional[Size] = None
    """The experts this device holds: the first `local` of `num` (one expert-parallel rank's share, as
    `--rank-local` writes it). The router still picks among all `num`; pairs routed to the others are
    other ranks' work. Absent: all `num`."""

    @property
    def held(self) -> int:
        """The experts this device computes: `local`, or all `num`."""
        return self.local if self.local is not None else self.num


class Gate(SpecModel):
    dtype: Literal["bf16", "fp32"]
    logits: Optional[Literal["bf16", "fp32"]] = None


class TopK(SpecModel):
    kind: Literal["topk"]


class GroupedTopK(SpecModel):
    kind: Literal["grouped_topk"]
    groups: Size
    topk_groups: Size


class HashSelect(SpecModel):
    kind: Literal["hash"]
    vocab: Size


class Router(SpecModel):
    gate: Gate
    scoring: Literal["softmax", "sigmoid", "sqrtsoftplus"]
    select: Annotated[Union[TopK, GroupedTopK, HashSelect], Field(discriminator="kind")]
    bias: Optional[bool] = None
    renormalize: Optional[bool] = None
    scale: Optional[PositiveFloat] = None
    """The routed output's scale (a checkpoint's `routed_scaling_factor`): above 0, since 0 would
    zero the layer's routed output and a negative one flip it, which no checkpoint does."""
    weight_on_input: Optional[bool] = None


class Activation(SpecModel):
    kind: Literal["silu", "gelu", "gelu_tanh", "swigluoai", "situ", "swiglustep"]
    gated: Optional[bool] = None
    interleaved: Optional[bool] = None
    limit: Optional[PositiveFloat] = None
    """The clamp of a clamped activation (gpt-oss's `swiglu_limit`): above 0, since the gate is
    clamped to at most `limit` and the up projection to [-limit, limit], empty for 0 or less."""
    alpha: Optional[PositiveFloat] = None
    """The sigmoid's slope of `swigluoai` (gpt-oss's 1.702): above 0, since 0 makes the gate a
    constant 1/2 and a negative one inverts it."""
    beta: Optional[float] = None

    @property
    def is_gated(self) -> bool:
        """Gated (w1 holds gate and up, 2·I rows) unless the case says `gated: false`."""
        return self.gated is not False


class Shared(SpecModel):
    count: Size
    inter: Size
    a1: Operand = _BF16
    w1: Operand
    w2: Operand
    gate: Optional[Literal["sigmoid"]] = None


class Zipf(SpecModel):
    kind: Literal["zipf"]
    s: PositiveFloat


class Routing(SpecModel):
    distribution: Union[Literal["natural", "balanced", "single_hot"], Zipf] = "natural"
    seed: Count = 0

    @property
    def name(self) -> str:
        d = self.distribution
        return d if isinstance(d, str) else f"zipf{d.s:g}"


class MoeArgs(OpArgs):
    """One MoE layer of the whole model (every expert, the full intermediate sizes), for `tokens`
    tokens of each dp group; `parallel` splits it over tp·dp ranks."""

    FAMILY = "moe"
    SIZE_AXIS = "tokens"

    tokens: Size
    hidden: Size
    out: OutDType = "bf16"
    experts: Experts
    router: Router
    activation: Activation
    shared: Optional[Shared] = None
    routing: Routing = Routing()
    parallel: Optional[Parallel] = None

    @property
    def width(self) -> int:
        """The width the experts run in: the latent width when set, else `hidden`."""
        return self.experts.latent or self.hidden

    @field_validator("parallel")
    @classmethod
    def _moe_axes(cls, parallel: Optional[Parallel]) -> Optional[Parallel]:
        return check_family_axes(parallel, "moe")

    @model_validator(mode="after")
    def _consistent(self) -> MoeArgs:
        e, sel = self.experts, self.router.select
        routable = e.num + (e.zero or 0)
        if e.local is not None and e.local > e.num:
            raise ValueError(f"experts.local={e.local} exceeds experts.num={e.num}")
        if e.local is not None and e.zero:
            raise ValueError("experts.local: an expert-parallel share of a layer with zero experts is not defined")
        if e.top_k > routable:
            raise ValueError(f"experts.top_k={e.top_k} exceeds the {routable} experts there are to pick")
        if isinstance(sel, GroupedTopK):
            if e.num % sel.groups:
                raise ValueError(f"router.select.groups={sel.groups} does not divide experts.num={e.num}")
            if sel.topk_groups > sel.groups:
                raise ValueError(f"router.select.topk_groups={sel.topk_groups} exceeds groups={sel.groups}")
            if e.top_k > sel.topk_groups * (e.num // sel.groups):
                raise ValueError(
                    f"experts.top_k={e.top_k} exceeds the {sel.topk_groups * (e.num // sel.groups)} experts "
                    f"in the {sel.topk_groups} selected groups")
        rows1 = 2 * e.inter if self.activation.is_gated else e.inter
        w = self.width
        check_group(e.a1, ("tokens", self.tokens, "hidden", w), "experts.a1")
        check_group(e.w1, ("w1 rows", rows1, "hidden", w), "experts.w1", weight=True)
        check_group(e.w2, ("hidden", w, "inter", e.inter), "experts.w2", weight=True)
        check_group(e.a2, ("tokens*top_k", self.tokens * e.top_k, "inter", e.inter), "experts.a2")
        if self.shared is not None:
            s = self.shared
            rows1 = 2 * s.inter * s.count if self.activation.is_gated else s.inter * s.count
            check_group(s.a1, ("tokens", self.tokens, "hidden", self.hidden), "shared.a1")
            check_group(s.w1, ("w1 rows", rows1, "hidden", self.hidden), "shared.w1", weight=True)
            check_group(s.w2, ("hidden", self.hidden, "inter", s.inter * s.count), "shared.w2",
                        weight=True)
        return self

    def flops(self) -> int:
        """The format's count: router + routed experts + latent projections + shared experts.

        The format writes 6·T·k·W·I for the experts: gate and up (4) plus down (2). A non-gated
        activation (`gated: false`) has no gate projection, so its experts count 4·T·k·W·I.
        """
        t, h, e = self.tokens, self.hidden, self.experts
        mult = 6 if self.activation.is_gated else 4
        # with `local`: the share of the T·k token-expert pairs that lands on the held experts
        total = 2 * t * h * e.num + mult * t * e.top_k * self.width * e.inter * e.held // e.num
        if e.latent:
            total += 4 * t * h * self.width
        if self.shared is not None:
            total += mult * t * h * self.shared.inter * self.shared.count
        return total

    def expected_experts_hit(self) -> float:
        """Experts expected to receive a token: k for single_hot, else uniform-routing odds.

        Backends report the count they actually used; this is for a case read on its own.
        """
        e = self.experts
        if self.routing.distribution == "single_hot":
            return float(min(e.top_k, e.held))
        return e.held * (1.0 - (1.0 - e.top_k / e.num) ** self.tokens)

    def min_bytes(self, experts_hit: Optional[float] = None) -> int:
        """Weights of the experts hit, router and shared weights, input and output activations."""
        e, h, w = self.experts, self.hidden, self.width
        hit = self.expected_experts_hit() if experts_hit is None else experts_hit
        rows1 = 2 * e.inter if self.activation.is_gated else e.inter
        per_expert = e.w1.bytes(rows1, w, weight=True) + e.w2.bytes(w, e.inter, weight=True)
        total = int(hit * per_expert)
        total += e.num * h * ELEMENT_BITS[self.router.gate.dtype] // 8
        if e.latent:
            total += 2 * h * w * 2  # down- and up-projection, bf16
        if self.shared is not None:
            s = self.shared
            srows = 2 * s.inter * s.count if self.activation.is_gated else s.inter * s.count
            total += s.w1.bytes(srows, h, weight=True) + s.w2.bytes(h, s.inter * s.count, weight=True)
        act = ELEMENT_BITS[self.out] // 8
        return total + self.tokens * h * 2 + self.tokens * h * act

    def scheme(self) -> str:
        w1 = self.experts.w1.scheme_name()
        a1 = self.experts.a1.scheme_name()
        return w1 if a1 == w1 else f"a={a1} w={w1}"

    def label(self) -> str:
        e = self.experts
        return (f"moe T={self.tokens} E={e.num} k={e.top_k} H={self.hidden} I={e.inter} "
                f"{self.routing.name}{self.split_label()}")

    def size(self) -> int:
        return self.tokens

    def family(self) -> str:
        e = self.experts
        return f"moe T=M E={e.num} k={e.top_k} H={self.hidden} I={e.inter} {self.routing.name}{self.split_label()}"

    def peak_dtypes(self) -> tuple[str, str]:
        return self.experts.a1.dtype, self.experts.w1.dtype

    def rank_shard(self, sources: Sequence[str] = (), shapes: LayerShapes = NO_LAYER_SHAPES) -> tuple[MoeArgs, str]:
        """(the MoE layer one rank runs, the rule), collectives left out; ShardRefused where one rank's
        work is no single `moe` case."""
        p = self.parallel
        if p is None:
            return self, "one device: the whole layer"
        if self.experts.local is not None:
            raise ShardRefused("experts.local: the case is already one rank's share")
        if p.dp > 1 and self.shared is not None:
            raise ShardRefused(f"dp={p.dp}: a rank's shared experts see its own batch while its routed experts see "
                               f"all {p.dp} batches; one rank-local case cannot hold both")
        world = p.world
        data = self.model_dump(mode="json", exclude_none=True)
        data.pop("parallel", None)
        data["tokens"] = self.tokens * p.dp
        if p.ep > 1:
            if self.experts.zero:
                raise ShardRefused("ep with zero experts: which rank holds a zero expert is not defined")
            local = divide(self.experts.num, p.ep, "experts.num")
            data["experts"] = {**data["experts"], "local": local}
            how = f"experts expert-parallel over {world}"
            moved = [f"rank 0 holds experts 0-{local - 1} of {self.experts.num} (experts.local {local})"]
        else:
            inter = divide(self.experts.inter, world, "experts.inter")
            data["experts"] = {**data["experts"], "inter": inter}
            how = f"experts tensor-parallel over {world}"
            moved = [f"experts.inter {self.experts.inter} -> {inter}"]
        if p.dp > 1:
            moved.append(f"tokens {self.tokens} -> {self.tokens * p.dp} (the {p.dp} dp batches its experts see; the "
                         "router runs over all of them here, on a rank over its own batch)")
        if self.shared is not None:
            s_inter = divide(self.shared.inter, p.tp, "shared.inter")
            data["shared"] = {**data["shared"], "inter": s_inter}
            moved.append(f"shared.inter {self.shared.inter} -> {s_inter}")
        try:
            return MoeArgs.model_validate(data), f"{how}: {', '.join(moved)}"
        except ValueError as err:
            raise ShardRefused(f"the shard is not a valid MoE layer: {err}") from err
