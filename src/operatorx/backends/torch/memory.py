"""Refuse a case that cannot fit before allocating it, with the numbers.

On the CPU "free" means what the kernel could give this process now: `MemAvailable` from
/proc/meminfo (free pages plus reclaimable page cache and slabs, the kernel's own estimate),
capped by the cgroup's memory limit minus its usage (v2 `memory.max`/`memory.current`, v1
`memory.limit_in_bytes`/`memory.usage_in_bytes`) when the process runs in a container. Free
pages alone (`SC_AVPHYS_PAGES`) miss the cache the kernel drops on demand and refuse cases
that fit.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from operatorx.backends.base import Unsupported

__all__ = ["require_memory", "free_bytes", "host_memory"]

_HEADROOM = 0.9   # leave 10% for the allocator's fragmentation and library workspaces


def _read_int(path: Path) -> Optional[int]:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _meminfo(proc: Path) -> dict[str, int]:
    """/proc/meminfo as bytes by field name (the file gives kB)."""
    out: dict[str, int] = {}
    try:
        lines = (proc / "meminfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name.strip()] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return out


def _cgroup_dirs(proc: Path, cgroup_root: Path) -> list[tuple[Path, int]]:
    """(directory, version) of this process's memory cgroups, from /proc/self/cgroup."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return []
    dirs: list[tuple[Path, int]] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        rel = rel.lstrip("/")
        if controllers == "":                                 # v2 unified hierarchy
            dirs.append((cgroup_root / rel, 2))
        elif "memory" in controllers.split(","):              # v1 memory controller
            dirs.append((cgroup_root / "memory" / rel, 1))
    return dirs


def _cgroup_room(proc: Path, cgroup_root: Path) -> Optional[tuple[int, int]]:
    """(limit - usage, limit) of the tightest memory cgroup limit over this process, or None."""
    best: Optional[tuple[int, int]] = None
    for directory, version in _cgroup_dirs(proc, cgroup_root):
        limit_name, usage_name = (("memory.max", "memory.current") if version == 2
                                  else ("memory.limit_in_bytes", "memory.usage_in_bytes"))
        # walk up: a parent's limit binds the children too
        for d in [directory, *directory.parents]:
            if d == cgroup_root.parent or not str(d).startswith(str(cgroup_root)):
                break
            limit = _read_int(d / limit_name)
            if limit is None or limit >= 1 << 60:           # "max" / v1's huge "unlimited"
                continue
            usage = _read_int(d / usage_name) or 0
            room = (max(0, limit - usage), limit)
            if best is None or room[0] < best[0]:
                best = room
    return best


def host_memory(proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> tuple[int, int]:
    """(available, total) bytes of host RAM for this process: MemAvailable, capped by cgroup limits."""
    info = _meminfo(proc)
    total = info.get("MemTotal")
    available = info.get("MemAvailable")
    if total is None or available is None:                   # not Linux, or an old kernel
        page = os.sysconf("SC_PAGE_SIZE")
        total = total or os.sysconf("SC_PHYS_PAGES") * page
        available = available or os.sysconf("SC_AVPHYS_PAGES") * page
    room = _cgroup_room(proc, cgroup_root)
    if room is not None:
        available = min(available, room[0])
        total = min(total, room[1])
    return available, total


def free_bytes(device: str) -> tuple[int, int]:
    """(free, total) bytes of device memory, or of host RAM (see host_memory) for the CPU."""
    if device == "cpu":
        return host_memory()
    import torch

    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()


def require_memory(needed_bytes: int, device: str) -> None:
    free, total = free_bytes(device)
    if needed_bytes > free * _HEADROOM:
        gib = 1 << 30
        how = " (MemAvailable, within cgroup limits)" if device == "cpu" else ""
        raise Unsupported(f"needs {needed_bytes / gib:.1f} GiB on {device}; {free / gib:.1f} GiB free{how} "
                          f"of {total / gib:.1f} GiB (90% usable)")
