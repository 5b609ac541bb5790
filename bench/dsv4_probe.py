"""Can vLLM 0.26's DeepSeek-V4 attention path load on this GPU? Each piece the first-cut dsv4_attn backend needs,
tried alone, one JSON line each (docs/dsv4-attention.md §6 step 0): the CuTe-DSL compressor module, the fused
q-norm / rope / fp8 insert op, FlashMLA's sparse support check, DeepGEMM. Prints, never raises."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from typing import Any


def _try(name: str, fn: Callable[[], Any]) -> None:
    try:
        out = {"probe": name, "ok": True, "value": repr(fn())[:300]}
    except Exception as err:  # noqa: BLE001 - the probe reports every failure as a line
        out = {"probe": name, "ok": False, "error": f"{type(err).__name__}: {str(err)[:500]}"}
    print(json.dumps(out), flush=True)


def main() -> None:
    import torch

    _try("device", lambda: torch.cuda.get_device_name())
    _try("vllm", lambda: importlib.import_module("vllm").__version__)
    _try("cutedsl_compressor", lambda: importlib.import_module(
        "vllm.models.deepseek_v4.nvidia.ops.sparse_attn_compress_cutedsl").__name__)
    _try("quack", lambda: importlib.import_module("quack.compile_utils").__name__)

    def fused_insert_op() -> Any:
        importlib.import_module("vllm._custom_ops")
        return torch.ops._C.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert

    _try("fused_qnorm_rope_kv_insert", fused_insert_op)

    def flashmla_sparse() -> Any:
        ops = importlib.import_module("vllm.v1.attention.ops.flashmla")
        return ops.is_flashmla_sparse_supported()

    _try("flashmla_sparse_supported", flashmla_sparse)
    _try("deep_gemm", lambda: importlib.import_module("vllm.utils.deep_gemm").has_deep_gemm())
    _try("dsv4_attention_class", lambda: importlib.import_module(
        "vllm.models.deepseek_v4.nvidia.flashmla").DeepseekV4FlashMLAAttention)


if __name__ == "__main__":
    main()
