"""CUDA-graph replay where vLLM would replay one.

vLLM captures the decode path for batch sizes up to its largest capture size (512 in 0.26 by
default) and pads a batch up to the next captured size; above it, it runs eagerly. The backend
captures the layer at the case's own M (so the timed work is the case's), and records the size
vLLM would have padded to.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any, Optional

import torch

from operatorx.measure.side_stream import side_stream

__all__ = ["GraphOrEager", "graph_size", "CapturedCall", "capture", "capture_for", "eager_kernel_names"]


def graph_size(tokens: int, sizes: list[int]) -> Optional[int]:
    """The captured size vLLM would run `tokens` in, or None when it runs eagerly."""
    sizes = sorted(sizes)
    i = bisect.bisect_left(sizes, tokens)
    return sizes[i] if i < len(sizes) else None


class CapturedCall:
    """`graph.replay()` as the timed call; `output` is the graph's static output tensor."""

    def __init__(self, graph: torch.cuda.CUDAGraph, output: Any):
        self.graph, self.output = graph, output

    def __call__(self) -> Any:
        self.graph.replay()
        return self.output


class GraphOrEager:
    """A built layer whose timed call is its captured graph when there is one, else `eager()`."""

    graph: Optional[CapturedCall]

    def eager(self) -> Any:
        raise NotImplementedError

    def timed(self) -> Any:
        return self.graph() if self.graph is not None else self.eager()


def capture(fn: Callable[[], Any], warmup: int = 2) -> CapturedCall:
    """Warm up on a side stream (as torch requires), then capture one call of `fn`."""
    side = side_stream()                   # one per process: see measure/side_stream.py
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize()
    return CapturedCall(graph, out)


def capture_for(fn: Callable[[], Any], world: int) -> CapturedCall:
    """The graph of one call; over several ranks inside vLLM's `graph_capture`, which readies its
    custom all-reduce's buffers for replay as an engine's capture does."""
    if world == 1:
        return capture(fn)
    from vllm.distributed.parallel_state import graph_capture

    with graph_capture(torch.device("cuda")):
        return capture(fn)


def eager_kernel_names(fn: Callable[[], Any]) -> list[str]:
    """Kernels one eager call launches (a graph replay can hide them from the profiler)."""
    from operatorx.measure.kernels import profile_kernels

    try:
        return [k["name"] for k in profile_kernels(fn, calls=1)]
    except Exception as err:  # noqa: BLE001 - metadata only
        return [f"profiler failed: {type(err).__name__}: {err}"[:200]]
