"""`collective` args: one collective of a served step (all_reduce, all_gather, reduce_scatter,
all_to_all) over the W = tp ranks of one host, timed on its own.

The message size follows NCCL-tests' convention: `elements` (× `dtype`) is NCCL-tests' `size`, the
full buffer of the collective:
- all_reduce: each rank's buffer (input and output alike);
- all_gather: the gathered output (each rank contributes elements/W);
- reduce_scatter: each rank's whole input (each rank keeps elements/W, the reduced shard);
- all_to_all: each rank's send buffer (elements/W to every rank, itself included; the receive
  buffer is as large).
`bytes` may be written instead of `elements`; it is read as `bytes / element size` elements, so a
case is written one way only (one computation, one key).

Work (the whole group's, as every row's rates): `flops()` counts the reductions' adds, (W-1)·elements
for all_reduce and reduce_scatter (each of the W ranks adds (W-1)/W·elements: its 1/W of the output,
each element a sum of W values) and 0 for the others. `min_bytes()` is the bytes every rank together
must send plus receive over point-to-point links, whatever the algorithm: each rank sends and
receives bus_factor · size (all_reduce 2(W-1)/W; the others (W-1)/W), so W · 2 · bus_factor · size
= 2·(W-1)·size (all_reduce: 4·(W-1)·size). One rank's share is min_bytes / W.
`bus_traffic()` gives NCCL-tests' size and bus factor, from which a row's algbw and busbw follow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Optional, get_args

from pydantic import field_validator, model_validator

from operatorx.spec.base import Size
from operatorx.spec.dtypes import ELEMENT_BITS
from operatorx.spec.op_type import BusTraffic, OpArgs
from operatorx.spec.parallel import Parallel, check_family_axes, world_size
from operatorx.spec.shard import NO_LAYER_SHAPES, LayerShapes, ShardRefused

__all__ = ["CollectiveArgs", "CollectiveKind", "CollectiveDType", "REDUCING", "bus_factor"]

CollectiveKind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
#: Whole-byte element dtypes: a message of packed 4-bit elements has no one element size.
CollectiveDType = Literal["bf16", "fp16", "fp32", "e4m3", "e5m2", "int8"]
#: The kinds that add the ranks' values.
REDUCING = frozenset({"all_reduce", "reduce_scatter"})


def bus_factor(kind: str, world: int) -> float:
    """NCCL-tests' busbw / algbw: all_reduce 2(W-1)/W; all_gather, reduce_scatter, all_to_all (W-1)/W.
    busbw is then the bytes each rank sends (and receives) per second at the optimal algorithm, so it
    compares across world sizes with the link's bandwidth."""
    share = (world - 1) / world
    return 2 * share if kind == "all_reduce" else share


class CollectiveArgs(OpArgs):
    """One collective over W = tp ranks; `elements` × `dtype` is NCCL-tests' size (the module says which buffer)."""

    FAMILY = "collective"
    SIZE_AXIS = "elements"

    kind: CollectiveKind
    elements: Size
    dtype: CollectiveDType
    parallel: Optional[Parallel] = None

    @model_validator(mode="before")
    @classmethod
    def _bytes_as_elements(cls, data: Any) -> Any:
        """`bytes` is read as elements of `dtype`; written back as `elements`."""
        if not isinstance(data, dict) or "bytes" not in data:
            return data
        data = dict(data)
        nbytes = data.pop("bytes")
        if "elements" in data:
            raise ValueError("bytes and elements: give one of them (bytes is read as elements of dtype)")
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes <= 0:
            raise ValueError(f"bytes={nbytes!r}: a positive integer")
        dtype = data.get("dtype")
        if dtype not in get_args(CollectiveDType):
            raise ValueError(f"bytes: needs dtype, one of {', '.join(get_args(CollectiveDType))} (got {dtype!r}), "
                             "to be read as elements")
        size = ELEMENT_BITS[dtype] // 8
        if nbytes % size:
            raise ValueError(f"bytes={nbytes}: not a whole number of {dtype} elements ({size} bytes each)")
        data["elements"] = nbytes // size
        return data

    @field_validator("parallel")
    @classmethod
    def _collective_axes(cls, parallel: Optional[Parallel]) -> Optional[Parallel]:
        return check_family_axes(parallel, "collective")

    @model_validator(mode="after")
    def _splits_evenly(self) -> CollectiveArgs:
        w = self.world
        if self.kind != "all_reduce" and self.elements % w:
            raise ValueError(f"elements={self.elements}: {self.kind} over tp={w} ranks cuts its buffer into {w} "
                             f"equal shards; {self.elements} does not divide by {w}")
        return self

    @property
    def world(self) -> int:
        """The ranks of the group: tp (1 without `parallel`)."""
        return world_size(self.parallel)

    @property
    def element_bytes(self) -> int:
        return ELEMENT_BITS[self.dtype] // 8

    @property
    def size_bytes(self) -> int:
        """NCCL-tests' size: elements × the dtype's bytes."""
        return self.elements * self.element_bytes

    def flops(self) -> int:
        """The reductions' adds over the group: (W-1)·elements for all_reduce and reduce_scatter, else 0."""
        return (self.world - 1) * self.elements if self.kind in REDUCING else 0

    def min_bytes(self) -> int:
        """Bytes every rank together sends plus receives at least: W · 2 · bus_factor · size (the module's rule)."""
        return 2 * (2 if self.kind == "all_reduce" else 1) * (self.world - 1) * self.size_bytes

    def bus_traffic(self) -> BusTraffic:
        return BusTraffic(size_bytes=self.size_bytes, bus_factor=bus_factor(self.kind, self.world))

    def scheme(self) -> str:
        return self.dtype

    def label(self) -> str:
        return f"{self.kind} {self.elements}x{self.dtype}{self.split_label()}"

    def size(self) -> int:
        return self.elements

    def family(self) -> str:
        return f"{self.kind} Nx{self.dtype}{self.split_label()}"

    def peak_dtypes(self) -> tuple[str, str]:
        return self.dtype, self.dtype

    def rank_shard(self, sources: Sequence[str], shapes: LayerShapes = NO_LAYER_SHAPES) -> tuple[OpArgs, str]:
        raise ShardRefused("a collective is the ranks' exchange itself: with the collectives left out, no work is "
                           "left to time")
