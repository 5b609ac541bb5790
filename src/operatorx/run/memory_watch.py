"""Did a case give its memory back? Device bytes held by torch's allocator and the process's
resident set, read the same way before a case and after its release.

Why both: a prepared layer that keeps a reference (a global cache, a closure) leaves device memory
behind and the next large case fails with an OOM that is not its own; on the CPU device the same
leak grows the resident set until cases flip between ok and "not enough memory".

A framework's first use of a kernel path may allocate state it keeps for the process's life (a
buffer it makes once, then reuses): that is not a leak of the case, and a fresh worker would only
make it again. So in each worker, the first case of an op type whose device growth passes the limit
(up to `first_use_limit_device_mib`) is taken as that one-time state, says so (`first_use`), and
keeps its worker; a second such case of the op type in the same worker is a leak.
"""

from __future__ import annotations

import ctypes
import gc
import os
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from operatorx.run.config import RunConfig

__all__ = ["MemoryReading", "read_memory", "MemoryDelta", "MemoryWatch"]

_MIB = 1024 * 1024


@dataclass(frozen=True)
class MemoryReading:
    host_rss_bytes: int
    device_allocated_bytes: Optional[int] = None
    """torch's allocator (memory_allocated) after empty_cache: what tensors still hold."""


@dataclass(frozen=True)
class MemoryDelta:
    before: MemoryReading
    after: MemoryReading
    first_use: bool = False
    """The device growth past the limit was taken as the op type's one-time state in this worker."""

    @property
    def host_growth_bytes(self) -> int:
        return self.after.host_rss_bytes - self.before.host_rss_bytes

    @property
    def device_growth_bytes(self) -> int:
        if self.before.device_allocated_bytes is None or self.after.device_allocated_bytes is None:
            return 0
        return self.after.device_allocated_bytes - self.before.device_allocated_bytes

    def leak(self, device_limit_mib: float, host_limit_mib: float) -> Optional[str]:
        """A sentence naming what was not given back, or None when both are within their limits."""
        parts = []
        if self.device_growth_bytes > device_limit_mib * _MIB and not self.first_use:
            parts.append(f"{self.device_growth_bytes / _MIB:.0f} MiB of device memory")
        if self.host_growth_bytes > host_limit_mib * _MIB:
            parts.append(f"{self.host_growth_bytes / _MIB:.0f} MiB of host memory")
        if not parts:
            return None
        return (f"memory leak: the case left {' and '.join(parts)} allocated after its release "
                f"(limits {device_limit_mib:g}/{host_limit_mib:g} MiB); its worker was replaced")

    def to_json(self) -> dict[str, Any]:
        doc = {"before": asdict(self.before), "after": asdict(self.after),
               "host_growth_bytes": self.host_growth_bytes, "device_growth_bytes": self.device_growth_bytes}
        return {**doc, "first_use": True} if self.first_use else doc


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _trim_heap() -> None:
    """Give freed heap pages back to the OS (glibc keeps them otherwise, and the resident set would
    count memory the case did free)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def read_memory(device_kind: str, thorough: bool = False) -> MemoryReading:
    """The reading; `thorough` first collects garbage and trims the heap (about 100 ms in a process
    that imported torch), so it is taken only to confirm a growth the quick reading saw."""
    if thorough:
        gc.collect()
    device = None
    if device_kind == "cuda":
        import torch

        try:
            if thorough:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            device = int(torch.cuda.memory_allocated())
        except RuntimeError:          # a poisoned context: the case's row already says so
            device = None
    if thorough:
        _trim_heap()
    return MemoryReading(host_rss_bytes=_rss_bytes(), device_allocated_bytes=device)


class MemoryWatch:
    """Memory before and after each case, cheaply: the reading after one case is the baseline of
    the next, and the slow, exact reading is taken only when the quick one shows a growth past a
    limit (garbage not yet collected and freed heap pages would otherwise look like a leak)."""

    def __init__(self, device_kind: str, device_limit_mib: float, host_limit_mib: float,
                 first_use_limit_device_mib: float = 0.0) -> None:
        self.device_kind, self.device_limit_mib, self.host_limit_mib = device_kind, device_limit_mib, host_limit_mib
        self.first_use_limit_device_mib = first_use_limit_device_mib
        self.first_use_taken: set[str] = set()
        """The op types whose one-time device state this worker has admitted (module docstring)."""
        self.baseline = read_memory(device_kind, thorough=True)

    @classmethod
    def for_run(cls, config: RunConfig) -> MemoryWatch:
        """The watch a worker of this run keeps: the run's device and its three limits."""
        return cls(config.device or "cpu", config.leak_limit_device_mib, config.leak_limit_host_mib,
                   config.first_use_limit_device_mib)

    def after_case(self, op_type: str) -> MemoryDelta:
        delta = MemoryDelta(self.baseline, read_memory(self.device_kind))
        if delta.leak(self.device_limit_mib, self.host_limit_mib) is not None:
            delta = MemoryDelta(self.baseline, read_memory(self.device_kind, thorough=True))
        growth_bytes = delta.device_growth_bytes
        if (self.device_limit_mib * _MIB < growth_bytes <= self.first_use_limit_device_mib * _MIB
                and op_type not in self.first_use_taken):
            self.first_use_taken.add(op_type)
            delta = replace(delta, first_use=True)
        self.baseline = delta.after
        return delta
