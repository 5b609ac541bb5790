"""The op types a testlist may name, each with its args model (the op-type interface, op_type.py).

Adding an op type: write its args model in a module of its own under `spec/` and add it here;
its backends register themselves in `operatorx.backends.registry`. Nothing else names op types.
"""

from __future__ import annotations

from operatorx.spec.attention import ATTENTION_TYPES
from operatorx.spec.collective import CollectiveArgs
from operatorx.spec.gemm import GemmArgs
from operatorx.spec.moe import MoeArgs
from operatorx.spec.op_type import OpArgs

__all__ = ["OP_TYPES", "known_types"]

OP_TYPES: dict[str, type[OpArgs]] = {"gemm": GemmArgs, "moe": MoeArgs, "collective": CollectiveArgs,
                                     **ATTENTION_TYPES}


def known_types() -> str:
    """The op types, for an error message."""
    return ", ".join(OP_TYPES)
