"""The torch backend's warm-up: cuBLAS's handle, workspace and first kernels before the first case."""

from __future__ import annotations

__all__ = ["warm"]


def warm(backend_name: str, device_kind: str) -> None:
    """One tiny GEMM on CUDA, so its one-time cost is the worker's, not the first case's (fp16 where
    bf16 has no GEMM, before sm_80)."""
    if device_kind != "cuda":
        return
    import torch

    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    a = torch.zeros((16, 16), dtype=dtype, device="cuda")
    torch.nn.functional.linear(a, a)
