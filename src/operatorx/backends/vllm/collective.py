"""The vllm backend's `collective`: not built. vLLM's own communicators (its custom all-reduce, the
pynccl wrapper, the all-to-all managers) are not wired here yet, so every case is `unsupported` with
that reason; the torch backend times torch.distributed's collectives. Imports no vLLM."""

from __future__ import annotations

from typing import NoReturn, Optional

from operatorx.backends.base import Unsupported
from operatorx.spec import Case

__all__ = ["VllmCollective", "NOT_BUILT"]

NOT_BUILT = ("vLLM's collectives (its custom all-reduce, pynccl, the all-to-all managers) are not built in this "
             "backend yet; --backend torch times torch.distributed's")


class VllmCollective:
    name = "vllm"
    op_type = "collective"

    def supports(self, case: Case, device: str) -> Optional[str]:
        return NOT_BUILT

    def supports_ranks(self, case: Case, device: str, world: int) -> Optional[str]:
        return NOT_BUILT

    def prepare(self, case: Case, device: str) -> NoReturn:
        raise Unsupported(NOT_BUILT)

    def prepare_ranks(self, case: Case, device: str, comm: object) -> NoReturn:
        raise Unsupported(NOT_BUILT)
