"""The one side stream of a process for work that must not run on the current stream: warm-up
before a CUDA-graph capture, and the capture of the L2 flush.

torch keeps a cuBLAS workspace per (handle, stream) for as long as the process lives (32 MiB each
on Hopper). A new stream per capture therefore left 32 MiB behind after every graph-captured
case. One stream for the process bounds that to one workspace.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["side_stream"]

_stream: Optional[Any] = None


def side_stream() -> Any:
    """The process's side stream on the current device (created on first use)."""
    global _stream
    import torch

    if _stream is None or _stream.device != torch.device("cuda", torch.cuda.current_device()):
        _stream = torch.cuda.Stream()
    return _stream
