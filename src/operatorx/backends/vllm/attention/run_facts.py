"""What every vllm attention row records about how its call ran: graph or eager, the selection environment,
the custom ops and IR op priorities (imports vLLM lazily, through common/env)."""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["run_facts"]


def run_facts(config: Any, graph: Any, size: Optional[int], mode: str) -> dict[str, Any]:
    """The metadata keys of the timed call: `graph` the captured call or None, `size` the graph size vLLM
    would pad to, `mode` its cudagraph_mode."""
    from operatorx.backends.vllm.common import describe_custom_ops, describe_ir_priority
    from operatorx.backends.vllm.env import selection_env

    return {"torch_compile": False, "cudagraph_mode": mode, "cuda_graph": graph is not None,
            "graph": graph is not None, "vllm_graph_size": size if graph is not None else None,
            "env": selection_env(), "custom_ops": describe_custom_ops(config),
            "ir_op_priority": describe_ir_priority(config)}
