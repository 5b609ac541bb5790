"""A `py:` backend that misbehaves on purpose, chosen by the case's m (the sweep tests' planted faults).

    m=1 hangs   m=2 os._exit(1)   m=3 segfault   m=4 raise SystemExit   m=5 leaks 300 MiB of host memory
    m=6 raises a CUDA-like fatal error   m=7 kills its parent (a Ray actor)   m=8 out of memory
    m=9 sleeps `slow_s` per call (for kill/resume tests)   anything else: an honest float GEMM
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from typing import Any

from operatorx.backends.py_file import gemm_inputs

_KEPT: list[Any] = []


def build(case: Any, device: str, slow_s: float = 0.0) -> Any:
    m = case.args.m
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
