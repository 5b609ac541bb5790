"""The torch GEMM's deeper entry points, so `run --host` can show where host time goes.

Each layer is the same op on the same prepared tensors, entered lower down:
- the public call (`F.linear`, `F.scaled_mm`): Python argument parsing, checks, list packing;
- the aten op called directly with its arguments filled in once (`torch.ops.aten.addmm`/`mm`,
  `torch._scaled_mm`, `torch.ops.aten._scaled_mm_v2`): the dispatcher and the kernel launch.
  `torch.ops.aten.X.default` goes through OpOverload.__call__ in Python and can cost more than
  the public call; `torch.mm`/`torch.addmm` (C bindings) are listed beside it for that reason;
- a CUDA-graph replay of the public call (CUDA only): what is left when Python is gone.
Anything a layer cannot do raises when called; the runner records that layer's error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from operatorx.measure.side_stream import side_stream

__all__ = ["float_layers", "fp8_layers", "GraphReplay"]


class GraphReplay:
    """A CUDA graph of `fn`, captured at the first call (so only `--host` pays for it).

    The graph is kept in `state["cuda_graph"]`, so the backend's release (state.clear) frees it.
    """

    def __init__(self, fn: Callable[[], Any], state: dict[str, Any]):
        self.fn = fn
        self.state = state

    def _capture(self) -> Any:
        side = side_stream()                   # one per process: see measure/side_stream.py
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):          # warm on a side stream, as torch.cuda.graphs advises
            for _ in range(3):
                self.fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.fn()
        self.state["cuda_graph"] = graph
        self.state["cuda_graph_out"] = out
        return graph

    def __call__(self) -> Any:
        graph = self.state.get("cuda_graph") or self._capture()
        graph.replay()
        return self.state["cuda_graph_out"]


def float_layers(public: Callable[[], Any], state: dict[str, Any], device: str) -> dict[str, Callable[[], Any]]:
    """public (F.linear) → aten.linear → aten addmm/mm (weight transposed once, outside) → graph replay."""
    aten = torch.ops.aten

    def aten_linear() -> Any:
        return aten.linear.default(state["a"], state["b"], state["bias"])

    def aten_mm() -> Any:
        b_t = state.setdefault("b_t", state["b"].t())      # a view, made once
        if state["bias"] is not None:
            return aten.addmm.default(state["bias"], state["a"], b_t)
        return aten.mm.default(state["a"], b_t)

    def torch_mm() -> Any:                                   # the C binding, no OpOverload in Python
        b_t = state.setdefault("b_t", state["b"].t())
        if state["bias"] is not None:
            return torch.addmm(state["bias"], state["a"], b_t)
        return torch.mm(state["a"], b_t)

    with_bias = state["bias"] is not None
    layers: dict[str, Callable[[], Any]] = {
        "public": public,
        "aten.linear": aten_linear,
        "aten.addmm" if with_bias else "aten.mm": aten_mm,
        "torch.addmm" if with_bias else "torch.mm": torch_mm,
    }
    if device == "cuda":
        layers["cuda_graph.replay"] = GraphReplay(public, state)
    return layers


def fp8_layers(public: Callable[[], Any], quant_a: Callable[[], Any], state: dict[str, Any],
               scale_a_layout: Callable[[Any], Any], scaling: tuple[Any, Any], out_dtype: torch.dtype,
               device: str) -> dict[str, Callable[[], Any]]:
    """public (activation quant when timed, scale layout, F.scaled_mm) → F.scaled_mm →
    torch._scaled_mm → aten._scaled_mm_v2 → graph replay.

    Below the public call the activation is quantized and its scales laid out once, outside:
    those layers time the matmul's own path. `torch._scaled_mm` infers the recipe from the scale
    shapes and may refuse one `F.scaled_mm` takes; its error is then this layer's result.
    """
    def prepacked() -> tuple[Any, ...]:
        if "layers_v2_args" not in state:
            aq, sa = quant_a()
            sa = scale_a_layout(sa)
            rec_a, rec_b = (int(s.value) for s in scaling)
            state["layers_v2_args"] = (aq, state["bq_t"], [sa], [rec_a], [], [state["sb"]], [rec_b], [],
                                       state["bias"], out_dtype, [], False)
        return state["layers_v2_args"]

    def f_scaled_mm() -> Any:
        aq, bq_t, (sa,), _, _, (sb,), *_ = prepacked()
        return F.scaled_mm(aq, bq_t, sa, scaling[0], sb, scaling[1], bias=state["bias"], output_dtype=out_dtype)

    def scaled_mm_v1() -> Any:
        aq, bq_t, (sa,), _, _, (sb,), *_ = prepacked()
        return torch._scaled_mm(aq, bq_t, sa, sb, bias=state["bias"], out_dtype=out_dtype)

    def scaled_mm_v2() -> Any:
        return torch.ops.aten._scaled_mm_v2.default(*prepacked())

    layers: dict[str, Callable[[], Any]] = {"public": public,
                                            "F.scaled_mm": f_scaled_mm, "torch._scaled_mm": scaled_mm_v1,
                                            "aten._scaled_mm_v2": scaled_mm_v2}
    if device == "cuda":
        layers["cuda_graph.replay"] = GraphReplay(public, state)
    return layers
