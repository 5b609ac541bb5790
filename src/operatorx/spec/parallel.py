"""`parallel`: the split a case runs under, in upstream OperatorX's meaning.

    "parallel": {"tp": T, "dp": D, "ep": E, "dcp": C}      each optional, default 1

The args are the full, unsplit layer (for dp: each dp group's own batch); the op runs over
world = T·D ranks of one host, its collectives inside the op. tp splits the weights (attention:
the heads), dp gives each of D groups its own batch, ep partitions whole experts (E is 1 or T·D),
dcp splits each request's KV cache within a tp group (C divides T). Which axes an op may use
depends on its family. No `parallel`, or every axis 1: one device.

The key of a case keeps only the axes above 1, so `{}`, `{"tp": 1}` and no `parallel` are one
case, and `{"tp": 8, "dp": 1}` is `{"tp": 8}`: one computation, one key, one seed.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import model_serializer, model_validator

from operatorx.spec.base import Size, SpecModel

__all__ = ["Parallel", "AXES", "FAMILY_AXES", "check_family_axes", "world_size", "normalized"]

AXES = ("tp", "dp", "ep", "dcp")
#: The axes each op family may split along (upstream core/parallel.py's GEMM/MOE/ATTENTION_AXES).
FAMILY_AXES: dict[str, tuple[str, ...]] = {"gemm": ("tp",), "moe": ("tp", "dp", "ep"),
                                           "attention": ("tp", "dp", "dcp"), "collective": ("tp",)}
"""A collective runs over one group of W ranks, written as tp=W whichever layer's group it is (an MoE's
all_to_all over dp·ep ranks included): one group size, one key."""


class Parallel(SpecModel):
    """A split over tp·dp ranks; validated as upstream validates it, written with axes > 1 only."""

    tp: Size = 1
    dp: Size = 1
    ep: Size = 1
    dcp: Size = 1

    @model_validator(mode="after")
    def _consistent(self) -> Parallel:
        if self.ep not in (1, self.world):
            raise ValueError(f"ep={self.ep}: expert parallelism spans every rank or none, so ep is 1 or "
                             f"tp·dp = {self.world}")
        if self.tp % self.dcp:
            raise ValueError(f"dcp={self.dcp} does not divide tp={self.tp} (the KV cache splits within a tp group)")
        return self

    @property
    def world(self) -> int:
        """The ranks the op runs over: tp·dp."""
        return self.tp * self.dp

    @property
    def is_single(self) -> bool:
        """Every axis 1: the op runs on one device, exactly as a case without `parallel`."""
        return all(getattr(self, axis) == 1 for axis in AXES)

    def split(self) -> dict[str, int]:
        """The axes above 1, in AXES order: the case key's form and the label's."""
        return {axis: getattr(self, axis) for axis in AXES if getattr(self, axis) > 1}

    @model_serializer(mode="plain")
    def _only_split_axes(self) -> dict[str, int]:
        return self.split()

    def label(self) -> str:
        """`tp8`, `tp2·dp4·ep8`: how tables name the split."""
        return "·".join(f"{axis}{n}" for axis, n in self.split().items())


def check_family_axes(parallel: Optional[Parallel], family: str) -> Optional[Parallel]:
    """The split if the family may use its axes (None for a single-device split); ValueError naming the axis."""
    if parallel is None or parallel.is_single:
        return None
    allowed = FAMILY_AXES[family]
    for axis, n in parallel.split().items():
        if axis not in allowed:
            why = "one group of W ranks, written tp=W" if family == "collective" else f"upstream's axes for {family}"
            raise ValueError(f"{axis}={n}: a {family} op splits only along {', '.join(allowed)} ({why})")
    return parallel


def world_size(parallel: Optional[Parallel]) -> int:
    """tp·dp of a split; 1 without one."""
    return 1 if parallel is None else parallel.world


def normalized(raw: Any) -> Any:
    """A `parallel` value as JSON with its 1-axes dropped (anything else is returned as is, for the
    validator to refuse)."""
    if isinstance(raw, dict):
        return {k: v for k, v in raw.items() if not (k in AXES and v == 1 and not isinstance(v, bool))}
    return raw
