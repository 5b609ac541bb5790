"""Whether a worker is compiling: a compiler among the live processes of its session.

A fresh machine's first case of a module builds its kernels just in time (DeepGEMM's and FlashInfer's
nvcc, Triton's ptxas, inductor's gcc), which can outlast a case deadline sized for timing; a timeout
there is a cold cache, not a hang. The parent asks this at a case's deadline and, while a compiler
runs, lets the deadline wait (run/worker_process.py, up to `RunConfig.compile_grace_s`).

Two readings, both cheap enough for every deadline: the CPU time of the worker's reaped children
(a compiler the case started and waited for: `popen`, `subprocess.run`, ninja's jobs) and the names
of the processes its session runs now (a compile still going).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from operatorx.run.session import session_processes

__all__ = ["COMPILER_NAMES", "compilers_running", "reaped_children_cpu_s"]

COMPILER_NAMES = frozenset({
    "nvcc", "cicc", "ptxas", "nvlink", "fatbinary", "cudafe++", "nvdisasm",     # CUDA's toolchain
    "ninja", "make", "cmake",                                                   # build drivers
    "cc", "gcc", "g++", "c++", "cc1", "cc1plus", "clang", "clang++", "ld", "ld.gold", "ld.lld", "as",
})
"""Process names (`/proc/PID/comm`, 15 characters at most) that are a compiler or its driver."""

_PROC = Path("/proc")


def _name(pid: int) -> Optional[str]:
    try:
        return (_PROC / str(pid) / "comm").read_text().strip()
    except OSError:                                   # gone meanwhile
        return None


def compilers_running(session_token: str, root_pid: Optional[int]) -> tuple[str, ...]:
    """The compilers (by name, sorted, once each) now running in the worker session `session_token`
    whose worker is `root_pid` (run/session.py finds them however they were started); empty when none."""
    names = {_name(pid) for pid in session_processes(session_token, root_pid)}
    return tuple(sorted(n for n in names if n is not None and n in COMPILER_NAMES))


def reaped_children_cpu_s(pid: int) -> Optional[float]:
    """CPU seconds (user + system) of the children `pid` has waited for, theirs included (the kernel's
    `cutime + cstime`); None when the process is gone. A compiler is CPU-bound, so the growth of this
    over a case is about the time its reaped compiles took (more for a parallel build)."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    rest = text[text.rfind(")") + 2:].split()         # after `pid (comm) `: state is field 3, cutime 16
    try:
        ticks = int(rest[13]) + int(rest[14])
    except (IndexError, ValueError):
        return None
    return ticks / os.sysconf("SC_CLK_TCK")
