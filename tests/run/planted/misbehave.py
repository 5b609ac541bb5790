"""A `py:` backend that misbehaves on purpose, chosen by the case's m (the sweep tests' planted faults).

    m=1 hangs   m=2 os._exit(1)   m=3 segfault   m=4 raise SystemExit   m=5 leaks 300 MiB of host memory
    m=6 raises a CUDA-like fatal error   m=7 kills its parent (a Ray actor)   m=8 out of memory
    m=9 sleeps `slow_s` per call (for kill/resume tests)
    m=10 "compiles" while it prepares: a CPU-busy child process named nvcc for `compile_s`, then
         `after_s` of sleep (a cold JIT cache, for the compile grace)
    anything else: an honest float GEMM
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from operatorx.backends.py_file import gemm_inputs

_KEPT: list[Any] = []


def _compile(seconds: float) -> None:
    """A child named `nvcc` (this Python under that name) that keeps a core busy for `seconds`."""
    with tempfile.TemporaryDirectory() as tmp:
        nvcc = os.path.join(tmp, "nvcc")
        os.symlink(sys.executable, nvcc)
        subprocess.run([nvcc, "-c", f"import time\nend = time.monotonic() + {seconds}\n"
                                    "while time.monotonic() < end: pass"], check=True)


def build(case: Any, device: str, slow_s: float = 0.0, compile_s: float = 0.0, after_s: float = 0.0) -> Any:
    m = case.args.m
    if m == 10:
        _compile(compile_s)
        time.sleep(after_s)
    if m == 5:
        _KEPT.append(bytearray(300 * 1024 * 1024))       # never freed: the worker must notice
    inputs = gemm_inputs(case, device)
    a, b = inputs["a"], inputs["b"]

    def call() -> Any:
        if m == 1:
            time.sleep(1000)
        elif m == 2:
            os._exit(1)
        elif m == 3:
            ctypes.string_at(0)
        elif m == 4:
            raise SystemExit(3)
        elif m == 6:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        elif m == 7:
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(5)
        elif m == 8:
            raise RuntimeError("CUDA out of memory. Tried to allocate 3.00 GiB")
        if slow_s:
            time.sleep(slow_s)
        return a @ b.t()

    return call
