"""vllm backends: vLLM's own layers (ReplicatedLinear, FusedMoE) under the quant config a
checkpoint of the case's scheme loads with. Registered on import; vLLM itself is imported only
when a case is prepared, so without vLLM every case is `unsupported` with the reason.
"""

from operatorx.backends.registry import register_backend
from operatorx.backends.vllm.gemm import VllmGemm
from operatorx.backends.vllm.moe import VllmMoe

register_backend("vllm", "gemm", VllmGemm)
register_backend("vllm", "moe", VllmMoe)

__all__ = ["VllmGemm", "VllmMoe"]
