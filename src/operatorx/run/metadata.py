"""What a run records about where it ran: host, device, software, git sha, environment."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

import operatorx
from operatorx.platform import DeviceInfo

__all__ = ["run_info", "git_sha", "behaviour_env"]

_ENV_PREFIXES = ("CUDA_", "TORCH_", "PYTORCH_", "NVIDIA_", "CUBLAS", "CUBLASLT", "VLLM_", "NCCL_", "HIP_",
                 "ROCM_", "OMP_", "MKL_", "TRITON_", "OPERATORX_")


def git_sha() -> Optional[str]:
    """The sha of the operatorx checkout, when it runs from one; '-dirty' when it has changes."""
    if os.environ.get("OPERATORX_GIT_SHA"):   # a copy without .git (a device machine) passes it in
        return os.environ["OPERATORX_GIT_SHA"]
    here = Path(operatorx.__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def behaviour_env() -> dict[str, str]:
    """Environment variables that can change which kernel runs or how fast (never a database secret:
    OPERATORX_DB may hold a password, and this is stored with the run)."""
    from operatorx.store.redact import SECRET_ENV

    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES) and k not in SECRET_ENV}


def run_info(device: DeviceInfo) -> dict[str, Any]:
    import torch

    software: dict[str, Any] = {"operatorx": operatorx.__version__, "python": platform.python_version(),
                                "torch": torch.__version__, "cuda": torch.version.cuda,
                                "hip": getattr(torch.version, "hip", None)}
    from operatorx.backends.names import recorded_versions

    for dist in recorded_versions():
        try:
            software[dist] = metadata.version(dist)   # read, not imported: importing vllm is slow
        except metadata.PackageNotFoundError:
            pass
    return {"host": socket.gethostname(), "device": device.to_json(), "driver": device.driver,
            "software": software, "git_sha": git_sha(), "env": behaviour_env()}
