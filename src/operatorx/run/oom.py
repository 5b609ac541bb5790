"""Did the kernel kill a worker for memory? The evidence the parent can read from outside (Linux).

A worker the OOM killer ends dies by SIGKILL with nothing in its log, the same as any other
SIGKILL; without evidence its case read `crashed`, and a 30 GB allocation looked like a flaky
worker. Two readings tell them apart:

- the memory cgroup's `oom_kill` counter (cgroup v2 `memory.events`, v1 `memory.oom_control`) of the
  worker's cgroup and those above it, read when the worker starts and after it died: the kernel
  counts every OOM kill in the victim's cgroup;
- the worker's resident set, sampled by the parent while a case runs, against the memory it may
  use (its cgroup's limit, or the machine's RAM): a SIGKILL at `OOM_NEAR_FRACTION` of that or more.

Either one makes a SIGKILL the parent did not send read `oom`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

__all__ = ["OOM_NEAR_FRACTION", "rss_bytes_of", "MemoryCgroup", "memory_cgroup", "oom_kill_evidence"]

OOM_NEAR_FRACTION = 0.9
"""A worker's sampled resident set at this fraction of its memory limit or more, then a SIGKILL
that the parent did not send: killed for memory."""

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_MIB = 1024 * 1024
_NO_LIMIT = 1 << 60             # v1 writes 2^63 rounded down to a page for "no limit"


def rss_bytes_of(pid: int) -> Optional[int]:
    """The resident set of process `pid` in bytes (None when it is gone or unreadable)."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _int_file(path: Path) -> Optional[int]:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    try:
        return int(text)
    except ValueError:
        return None                  # "max" (v2): no limit


def _oom_kill_count(path: Path) -> Optional[int]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _machine_ram_bytes() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


@dataclass(frozen=True)
class MemoryCgroup:
    """A process's memory cgroup directories, its own first then each one above it, with the file
    names of this cgroup version."""
    dirs: tuple[Path, ...] = ()
    limit_file: str = "memory.max"
    events_file: str = "memory.events"
    oom_kills_at_start: tuple[Optional[int], ...] = field(default=())

    def oom_kills(self) -> tuple[Optional[int], ...]:
        """The `oom_kill` counter of each directory (None where unreadable)."""
        return tuple(_oom_kill_count(d / self.events_file) for d in self.dirs)

    def limit_bytes(self) -> Optional[int]:
        """The memory the process may use: the lowest limit on its cgroup path, or the machine's
        RAM when that is lower or there is none."""
        limits = [v for v in (_int_file(d / self.limit_file) for d in self.dirs) if v is not None and v < _NO_LIMIT]
        ram = _machine_ram_bytes()
        if ram is not None:
            limits.append(ram)
        return min(limits) if limits else None


def _ancestors(mount: Path, rel: str) -> tuple[Path, ...]:
    """`mount/rel` and each directory above it up to `mount`; only those that exist (in a cgroup
    namespace /proc may name a path the mount does not show: then the mount's root is the cgroup)."""
    parts = [p for p in rel.strip("/").split("/") if p]
    dirs = [mount.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]
    return tuple(d for d in dirs if d.is_dir())


def memory_cgroup(pid: int) -> MemoryCgroup:
    """The memory cgroup of process `pid` (v2 or v1), with its `oom_kill` counters read now; an
    empty one where there is none to read."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return MemoryCgroup()
    v1 = [ln.split(":", 2)[2] for ln in lines if ln.count(":") >= 2 and "memory" in ln.split(":", 2)[1].split(",")]
    if v1 and (_CGROUP_ROOT / "memory").is_dir():
        group = MemoryCgroup(_ancestors(_CGROUP_ROOT / "memory", v1[0]), "memory.limit_in_bytes", "memory.oom_control")
    else:
        v2 = [ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")]
        if not v2 or not (_CGROUP_ROOT / "cgroup.controllers").exists():
            return MemoryCgroup()
        group = MemoryCgroup(_ancestors(_CGROUP_ROOT, v2[0]))
    return MemoryCgroup(group.dirs, group.limit_file, group.events_file, group.oom_kills())


def oom_kill_evidence(group: MemoryCgroup, peak_rss_bytes: Optional[int],
                      limit_bytes: Optional[int]) -> Optional[str]:
    """Why a worker that died by SIGKILL (not the parent's) was killed for memory, in words; None
    when nothing says so."""
    now = group.oom_kills()
    for path, before, after in zip(group.dirs, group.oom_kills_at_start, now, strict=False):
        if before is not None and after is not None and after > before:
            return (f"the kernel's OOM killer ran while it did (oom_kill {before} -> {after} in "
                    f"{path / group.events_file})")
    if peak_rss_bytes is not None and limit_bytes and peak_rss_bytes >= OOM_NEAR_FRACTION * limit_bytes:
        return (f"its resident set had reached {peak_rss_bytes / _MIB:,.0f} MiB of the {limit_bytes / _MIB:,.0f} MiB "
                f"it may use ({peak_rss_bytes / limit_bytes:.0%})")
    return None
