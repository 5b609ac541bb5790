"""The torch backend for one MoE layer (router → dispatch → grouped experts → combine, + shared)."""

from operatorx.backends.torch.moe.layer import MoeLayer, TorchMoe, build_layer

__all__ = ["TorchMoe", "MoeLayer", "build_layer"]
