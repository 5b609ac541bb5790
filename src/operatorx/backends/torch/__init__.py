"""torch backends: registered on import."""

from operatorx.backends.registry import register_backend
from operatorx.backends.torch.gemm import TorchGemm

register_backend("torch", "gemm", TorchGemm)

__all__ = ["TorchGemm"]
