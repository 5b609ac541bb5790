"""Refuse a case that cannot fit before allocating it, with the numbers."""

from __future__ import annotations

import os

import torch

from operatorx.backends.base import Unsupported

__all__ = ["require_memory", "free_bytes"]

_HEADROOM = 0.9   # leave 10% for the allocator's fragmentation and library workspaces


def free_bytes(device: str) -> tuple[int, int]:
    """(free, total) bytes of device memory, or of host RAM for the CPU."""
    if device == "cpu":
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()


def require_memory(needed_bytes: int, device: str) -> None:
    free, total = free_bytes(device)
    if needed_bytes > free * _HEADROOM:
        gib = 1 << 30
        raise Unsupported(f"needs {needed_bytes / gib:.1f} GiB on {device}; {free / gib:.1f} GiB free "
                          f"of {total / gib:.1f} GiB (90% usable)")
