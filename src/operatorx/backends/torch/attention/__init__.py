"""The torch backends of the gqa and mla attention modules (materialized K/V, paged cache, torch SDPA)."""

from operatorx.backends.torch.attention.backend import TorchGqa, TorchMla

__all__ = ["TorchGqa", "TorchMla"]
