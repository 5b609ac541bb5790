"""torch backends: registered on import."""

from operatorx.backends.registry import register_backend
from operatorx.backends.torch.gemm import TorchGemm
from operatorx.backends.torch.moe import TorchMoe

register_backend("torch", "gemm", TorchGemm)
register_backend("torch", "moe", TorchMoe)

__all__ = ["TorchGemm", "TorchMoe"]
