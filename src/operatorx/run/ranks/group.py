"""A worker's place in a multi-rank group: one torch.distributed process group per worker process.

The group is made at the first case of its split and kept for the cases after it (the parent sends
a worker cases of one group only). Rendezvous is tcp://127.0.0.1 on the port the parent chose.
- CPU: one gloo group, for the op's collectives and the ranks' control messages alike.
- CUDA: an NCCL group for the op's collectives (NVLink multicast off: NCCL_NVLS_ENABLE=0, as the
  runs this tool compares with set it), bound to this worker's one visible GPU, and a gloo group
  beside it for control messages, which must never wait on the GPU.
Both time out after the assignment's `timeout_s`, which the parent bounds by the case's deadline.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from typing import Any, Optional

from operatorx.run.ranks.assignment import RankAssignment

__all__ = ["RankGroup", "ensure_group", "current_group", "GroupMismatch"]


class GroupMismatch(RuntimeError):
    """The worker is in one group and was sent a case of another (a parent's error: never expected)."""


class RankGroup:
    """This process's group: `device_group` for the op, `cpu_group` for agreement (measure/rank_timing.Agree)."""

    def __init__(self, assignment: RankAssignment, device_kind: str):
        import torch
        import torch.distributed as dist

        from operatorx.backends.process_state import release_for_group

        release_for_group()                 # a backend's one-rank world (vLLM's) goes first
        self.assignment = assignment
        self.rank, self.world = assignment.rank, assignment.world
        self.device_kind = device_kind
        timeout = datetime.timedelta(seconds=assignment.timeout_s)
        init = f"tcp://127.0.0.1:{assignment.port}"
        if assignment.backend == "nccl":
            os.environ["NCCL_NVLS_ENABLE"] = "0"
            torch.cuda.set_device(0)            # the worker's one visible GPU
            dist.init_process_group("nccl", init_method=init, rank=self.rank, world_size=self.world,
                                    timeout=timeout, device_id=torch.device("cuda", 0))
            self.device_group: Any = dist.group.WORLD
            self.cpu_group: Any = dist.new_group(backend="gloo", timeout=timeout)
        else:
            dist.init_process_group("gloo", init_method=init, rank=self.rank, world_size=self.world,
                                    timeout=timeout)
            self.device_group = self.cpu_group = dist.group.WORLD
        self._one = torch.zeros(1, device="cuda" if device_kind == "cuda" else "cpu")

    @property
    def key(self) -> str:
        return self.assignment.group

    @property
    def backend_name(self) -> str:
        return self.assignment.backend

    # --- the control channel (measure/rank_timing.Agree) -------------------------------------------
    def max_floats(self, values: Sequence[float]) -> list[float]:
        import torch
        import torch.distributed as dist

        t = torch.tensor(list(values), dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.cpu_group)
        return [float(v) for v in t.tolist()]

    def gather_floats(self, values: Sequence[float]) -> list[list[float]]:
        import torch
        import torch.distributed as dist

        mine = torch.tensor(list(values), dtype=torch.float64)
        out = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(out, mine, group=self.cpu_group)
        return [[float(v) for v in t.tolist()] for t in out]

    def gather_objects(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.cpu_group)
        return out

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=src, group=self.cpu_group)
        return box[0]

    # --- barriers ----------------------------------------------------------------------------------
    def barrier(self) -> None:
        """Before a timed iteration: an all_reduce of one element on the op's group. On CUDA it is
        enqueued on the device and the host goes on (no synchronization); on gloo it blocks."""
        import torch.distributed as dist

        dist.all_reduce(self._one, group=self.device_group)

    def destroy(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


_GROUP: Optional[RankGroup] = None


def current_group() -> Optional[RankGroup]:
    return _GROUP


def ensure_group(assignment: RankAssignment, device_kind: str) -> tuple[RankGroup, bool]:
    """(this worker's group for `assignment`, whether it was made now). GroupMismatch when the worker
    is already in another group."""
    global _GROUP
    if _GROUP is not None:
        if _GROUP.key != assignment.group or _GROUP.rank != assignment.rank:
            raise GroupMismatch(f"this worker is rank {_GROUP.rank} of group {_GROUP.key}; the case is for rank "
                                f"{assignment.rank} of group {assignment.group}")
        return _GROUP, False
    _GROUP = RankGroup(assignment, device_kind)
    return _GROUP, True
