"""Which GPUs a sweep may use, found without creating a CUDA context in the parent.

The parent process of a sweep never initialises CUDA (a context there would hold memory on
every GPU and make forking unsafe); NVML counts the devices, and CUDA_VISIBLE_DEVICES, when
set, narrows and orders them exactly as CUDA would.
"""

from __future__ import annotations

import os
from typing import Optional

from operatorx import bytecode_cache

__all__ = ["visible_gpus", "parse_gpus", "worker_env"]


def _nvml_count() -> Optional[int]:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML (a CPU machine, ROCm): ask torch below
        return None


def visible_gpus() -> list[str]:
    """The CUDA_VISIBLE_DEVICES entries a worker may be given, in CUDA's order."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    count = _nvml_count()
    if count is None:
        try:
            import torch

            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        except Exception:  # noqa: BLE001
            count = 0
    return [str(i) for i in range(count)]


def parse_gpus(text: Optional[str]) -> Optional[tuple[int, ...]]:
    """`all` (or None) → None; `0,1,3` → (0, 1, 3), indices among the visible GPUs."""
    if text is None or text.strip() == "all":
        return None
    try:
        chosen = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError as err:
        raise ValueError(f"--gpus {text!r}: use all or a list of GPU indices such as 0,1") from err
    if not chosen or len(set(chosen)) != len(chosen) or min(chosen) < 0:
        raise ValueError(f"--gpus {text!r}: use all or distinct GPU indices such as 0,1")
    return chosen


def worker_env(device_entry: Optional[str], cpu_share: Optional[int] = None) -> dict[str, str]:
    """The environment of a worker: one GPU (by its CUDA_VISIBLE_DEVICES entry), or none on the
    CPU device, and CUDA's device order pinned to PCI bus order so NVML and CUDA agree. The database's
    secrets (OPERATORX_DB, PGPASSWORD) stay with the parent: a worker stores nothing, and what it runs
    (a user's backend) need not see them."""
    from operatorx.store.redact import SECRET_ENV

    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
    if device_entry is not None:
        if "CUDA_VISIBLE_DEVICES" not in os.environ:     # our indices are NVML's: PCI bus order
            env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        env["CUDA_VISIBLE_DEVICES"] = device_entry
    if cpu_share is not None:
        env["OMP_NUM_THREADS"] = str(cpu_share)
    env["PYTHONUNBUFFERED"] = "1"
    return bytecode_cache.worker_env(env)      # an image that forbids .pyc files: compile torch once, not per worker
