"""What a backend implements to run a split case over W ranks (a multi-rank case, docs/scaling.md).

Every rank of the group calls the same methods with the same case. `prepare_ranks` builds this
rank's part of the whole layer from the case's seed (each rank makes the whole layer's inputs the
same way and keeps its share), so the gathered output can be checked against the unsplit fp32
reference exactly as a single-device case is. Its `Prepared.fn` is the rank's timed call, its
collectives inside; its `check` is collective too (every rank calls it; rank 0 compares) and
returns the same Check on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, runtime_checkable

from operatorx.backends.base import Prepared
from operatorx.spec import Case

__all__ = ["RankComm", "RankPrepared", "RankedBackend", "gather_function"]


class RankComm(Protocol):
    """A backend's view of its rank in the group."""

    rank: int
    world: int
    device_group: Any
    """The process group the op's collectives run on (gloo on the CPU, NCCL on CUDA)."""

    @property
    def backend_name(self) -> str: ...

    def broadcast_object(self, obj: Any, src: int = 0) -> Any: ...


@dataclass
class RankPrepared:
    """One rank's prepared part of a multi-rank case."""

    prepared: Prepared
    flops: int
    """FLOPs of one call of the whole group (every rank's share): the row's rates use it."""
    min_bytes: int
    """Bytes one call of the whole group must move at least."""
    collectives: list[str] = field(default_factory=list)
    """The collectives inside the timed call, with the group's backend: `all_reduce (gloo)`."""


@runtime_checkable
class RankedBackend(Protocol):
    def supports_ranks(self, case: Case, device: str, world: int) -> Optional[str]:
        """None when this backend can run the case over `world` ranks on `device`; else why not."""

    def prepare_ranks(self, case: Case, device: str, comm: RankComm) -> RankPrepared:
        """This rank's part of the case (a collective: every rank calls it)."""


def gather_function() -> tuple[Any, str]:
    """torch.distributed's gather into one tensor under its current name (`all_gather_single` from
    torch 2.13, `all_gather_into_tensor` before), and that name."""
    import torch.distributed as dist

    fn = getattr(dist, "all_gather_single", None)
    if fn is not None:
        return fn, "all_gather_single"
    return dist.all_gather_into_tensor, "all_gather_into_tensor"
