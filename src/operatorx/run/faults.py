"""What went wrong with a case, in one word (`error_kind`), and what the sweep does about it.

    exception   the backend raised; the worker goes on
    check       the result was wrong; the worker goes on
    oom         out of memory: an allocator failed (device or host: MemoryError, ENOMEM, bad_alloc), or
                the kernel killed the worker for memory (run/oom.py); tried once more in a fresh
                worker, then an error
    cuda_fault  the CUDA context is poisoned (illegal address, launch failure, device assert):
                every later call in that process would fail, so the worker is replaced
    timeout     the case passed its deadline: the worker's process group is killed
    crashed     the worker died (exit, signal, segfault) while running the case
    leak        the case did not give its memory back; the worker is replaced
"""

from __future__ import annotations

import re
from typing import Literal, Optional

__all__ = ["ErrorKind", "classify_message", "died_of_allocation", "hung_at", "poisons_worker", "RETRIED_KINDS",
           "KILLS_ALLOWED"]

ErrorKind = Literal["exception", "check", "oom", "cuda_fault", "timeout", "crashed", "leak"]

#: A case whose worker died of one of these is tried once more in a fresh worker: an OOM may be
#: memory that earlier cases left behind, a crash may be a flake. A second failure is final.
RETRIED_KINDS: frozenset[str] = frozenset({"oom", "crashed", "cuda_fault"})
#: A case that has killed this many workers is not tried again.
KILLS_ALLOWED = 2

# CUDA errors after which the context is unusable ("sticky" errors), as torch and the driver word them.
_CUDA_FAULT = re.compile(
    r"illegal memory access|illegal address|unspecified launch failure|device-side assert|misaligned address|"
    r"illegal instruction|CUDA error: an? (?:illegal|unspecified)|cudaErrorLaunchFailure|"
    r"CUDA_ERROR_ILLEGAL_ADDRESS|hardware stack error|uncorrectable ECC", re.IGNORECASE)
# Device and host allocator failures: CUDA's and cuBLAS's, Python's MemoryError, the C library's
# ENOMEM ("Cannot allocate memory", errno 12), C++'s std::bad_alloc, and torch's CPU allocator
# ("DefaultCPUAllocator: can't allocate memory", "CPU: not enough memory").
_OOM = re.compile(r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation|"
                  r"\bMemoryError\b|cannot allocate memory|can't allocate memory|not enough memory|"
                  r"\bbad_alloc\b|\[Errno 12\]|\bENOMEM\b", re.IGNORECASE)

_LAST_LINES = 3
"""The lines at the end of a dead worker's log that may say it died of an allocator failure."""


def classify_message(message: Optional[str], wrong_result: bool = False) -> ErrorKind:
    """The kind of an `error` row the worker itself produced, from its message."""
    text = message or ""
    if wrong_result:
        return "check"
    if _CUDA_FAULT.search(text):
        return "cuda_fault"
    if _OOM.search(text):
        return "oom"
    return "exception"


def died_of_allocation(log_tail: str) -> bool:
    """A worker that exited (not killed) with an allocator failure among the last lines of its log:
    an uncaught MemoryError, or C++'s `terminate called after throwing ... std::bad_alloc`. Only the
    last lines count, so an earlier case's warning does not."""
    lines = [ln for ln in log_tail.splitlines() if ln.strip()][-_LAST_LINES:]
    return any(_OOM.search(ln) and not _CUDA_FAULT.search(ln) for ln in lines)


_THREAD_HEAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ ")
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def hung_at(log_tail: str, loop: str = "_serve") -> Optional[str]:
    """Where a timed-out case waited, from the Python stacks its worker wrote (faulthandler, on
    STACKS_SIGNAL): the innermost frame (`file.py:line in func`) of the thread whose stack holds the
    worker's case loop `loop`; None without such a stack."""
    blocks: list[list[str]] = []
    for line in log_tail.splitlines():
        if _THREAD_HEAD.match(line):
            blocks.append([])
        elif blocks:
            blocks[-1].append(line)
    for frames in reversed(blocks):                      # the last dump in the log is this timeout's
        parsed = [m for m in map(_FRAME.match, frames) if m is not None]
        if parsed and any(m["func"] == loop for m in parsed):
            top = parsed[0]
            return f"{top['path'].rsplit('/', 1)[-1]}:{top['line']} in {top['func']}"
    return None


def poisons_worker(kind: Optional[str]) -> bool:
    """After these the worker process must not run another case."""
    return kind in ("cuda_fault", "oom", "leak")
