"""What the parent tells each of a multi-rank case's W workers: its rank and how to find the others.

Sent with the case (the `rank` key of a `case` message, run/protocol.py). The group key names one
group of W worker processes: a worker joins one group in its life and runs only that group's
cases (vLLM's parallel state, like torch.distributed's default group, is built once per process).
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, NonNegativeInt, PositiveInt, model_validator

from operatorx.result_ranks import PlacementGroup

__all__ = ["RankAssignment", "GroupBackend"]

GroupBackend = Literal["gloo", "nccl"]


class RankAssignment(BaseModel):
    """Rank `rank` of `world` in group `group`, whose rendezvous is tcp://127.0.0.1:`port`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: NonNegativeInt
    world: PositiveInt
    split: str
    """The case's split label (`tp2`, `dp2·ep2`): the group serves cases of this split only."""
    group: str
    """The group's key: the same on its W workers, new for every group the parent forms."""
    port: PositiveInt
    backend: GroupBackend
    """gloo on the CPU device, nccl on CUDA (with NCCL_NVLS_ENABLE=0)."""
    timeout_s: float
    """The group's collective timeout: bounded by the case's deadline, so a rank waiting on a dead or
    hung peer raises before the parent kills it, and says so."""
    workers: list[str]
    """The slot names of the W ranks, in rank order (for the row's per-rank lines)."""
    gpus: list[Optional[str]]
    """Each rank's GPU (its CUDA_VISIBLE_DEVICES entry), in rank order; None on the CPU device."""
    placement_group: Optional[PlacementGroup] = None
    """Where a cluster scheduler put the W processes together (Ray: one placement group on one node),
    for the row; None for a host's own workers."""

    @model_validator(mode="after")
    def _consistent(self) -> RankAssignment:
        if self.rank >= self.world:
            raise ValueError(f"rank {self.rank} of a group of {self.world}")
        if len(self.workers) != self.world or len(self.gpus) != self.world:
            raise ValueError(f"workers and gpus name {self.world} ranks each")
        if not self.timeout_s > 0:
            raise ValueError("timeout_s must be > 0")
        return self
