"""A process group of this worker alone, for a collective case of one rank (W = 1) on the single-device path.

The worker's default group belongs to the multi-rank path (run/ranks/group.py makes it when the worker
joins a group), so this one is built beside it and never initializes the default group: a
ProcessGroup over an in-process store with one backend registered for the device (gloo on the CPU,
NCCL on CUDA). It is made once per process and device kind and kept, as the rank path keeps its group.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch

from operatorx.backends.base import Unsupported

__all__ = ["one_rank_group"]

_TIMEOUT = datetime.timedelta(seconds=120)
_GROUPS: dict[str, tuple[Any, str]] = {}


def one_rank_group(device: str) -> tuple[Any, str]:
    """(a one-rank process group for `device`, its backend's name); Unsupported when this torch cannot
    make one beside the run's."""
    made = _GROUPS.get(device)
    if made is not None:
        return made
    import torch.distributed as dist

    if not dist.is_available():
        raise Unsupported("torch.distributed is not available in this torch build")
    try:
        store = dist.PrefixStore(f"operatorx-one-rank-{device}", dist.HashStore())
        group = dist.ProcessGroup(store, 0, 1)
        if device == "cuda":
            kind, name = dist.ProcessGroup.BackendType.NCCL, "nccl"
            backend: Any = dist.ProcessGroupNCCL(store, 0, 1, dist.ProcessGroupNCCL.Options())
            where = torch.device("cuda", torch.cuda.current_device())
        else:
            kind, name = dist.ProcessGroup.BackendType.GLOO, "gloo"
            backend = dist.ProcessGroupGloo(store, 0, 1, _TIMEOUT)
            where = torch.device("cpu")
        group._set_default_backend(kind)
        group._register_backend(where, kind, backend)
    except (AttributeError, TypeError, RuntimeError) as err:
        raise Unsupported(f"a one-rank collective runs on a process group of this worker alone, which torch "
                          f"{torch.__version__} cannot make beside the run's: {type(err).__name__}: {err}") from err
    _GROUPS[device] = (group, name)
    return group, name
