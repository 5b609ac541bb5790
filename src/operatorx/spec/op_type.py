"""The op-type interface: what every reader asks of a case's args, answered by the args model.

An op type is one args model (a subclass of `OpArgs`) registered in `operatorx.spec.op_types`;
nothing outside `spec/` and the backends switches on the op type. Labels, FLOP and byte counts,
the scheme, the size axis the Shape page plots against, the plot family and the peak class are
the args model's answers, so a new op type is one module and its backends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Optional

from operatorx.spec.base import SpecModel
from operatorx.spec.parallel import Parallel
from operatorx.spec.shard import NO_LAYER_SHAPES, LayerShapes, ShardRefused

__all__ = ["OpArgs", "BusTraffic"]


@dataclass(frozen=True)
class BusTraffic:
    """A collective's NCCL-tests counts: algbw = size_bytes / time, busbw = algbw × bus_factor."""

    size_bytes: int
    """NCCL-tests' size: the collective's full buffer (spec/collective.py says which one per kind)."""
    bus_factor: float
    """busbw / algbw (all_reduce 2(W-1)/W; all_gather, reduce_scatter, all_to_all (W-1)/W)."""


class OpArgs(SpecModel):
    """The args of one op type. Subclasses set the class facts and answer the methods."""

    FAMILY: ClassVar[str] = ""
    """The op family: `gemm`, `moe`, `attention` or `collective` (which `parallel` axes it may use, FAMILY_AXES)."""
    SIZE_AXIS: ClassVar[str] = ""
    """The arg the Shape page plots against (`m`, `tokens`, `batch`)."""
    IMPLEMENTED: ClassVar[bool] = True
    """False for an upstream op type this version loads but cannot run yet (its rows are unsupported)."""
    MISSING: ClassVar[str] = ""
    """With IMPLEMENTED False: what no backend builds yet, named on its unsupported rows."""

    def missing(self) -> str:
        """What the unsupported row of this case names: MISSING, which a type may lead with the case's own
        fields that the framework it points to cannot run either."""
        return self.MISSING

    parallel: Optional[Parallel] = None

    def label(self) -> str:
        """A short human label, e.g. `gemm 1x7168x2048`."""
        raise NotImplementedError

    def flops(self) -> int:
        """FLOPs of one call of the whole layer the args describe."""
        raise NotImplementedError

    def min_bytes(self) -> int:
        """The fewest bytes one call must move."""
        raise NotImplementedError

    def scheme(self) -> str:
        """The quant scheme in short (`bf16`, `a=... b=...`)."""
        raise NotImplementedError

    def size(self) -> int:
        """The value on SIZE_AXIS."""
        raise NotImplementedError

    def family(self) -> str:
        """The label with the size left out: cases of one family differ only in `size()`."""
        raise NotImplementedError

    def peak_dtypes(self) -> tuple[str, str]:
        """(activation, weight) element dtypes: which compute peak the case is held against."""
        raise NotImplementedError

    def cost_parts(self) -> Optional[dict[str, int]]:
        """flops() and min_bytes() by part, where the op type splits them (attention: projections, attention
        over the context, cache, state); None otherwise. Rows name the part that bounds the call."""
        return None

    def bus_traffic(self) -> Optional[BusTraffic]:
        """A collective's size and bus factor (its row's algbw, busbw); None for an op that is not one.
        A collective's bound is the interconnect, not the peaks table's, so its rows carry no `% peak`."""
        return None

    def rank_shard(self, sources: Sequence[str], shapes: LayerShapes = NO_LAYER_SHAPES) -> tuple[OpArgs, str]:
        """(the args one rank runs, the rule it was cut by), collectives left out (spec/shard.py);
        ShardRefused when this version has no such shard."""
        raise ShardRefused(f"{self.FAMILY} ops have no rank-local shard in this version")

    def split_label(self) -> str:
        """` tp8` for a split case, "" on one device: appended to labels so a split never reads as one GPU."""
        return f" {self.parallel.label()}" if self.parallel is not None else ""
