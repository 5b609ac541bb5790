"""The backend table: every shipped backend is one entry, told apart without loading any backend.

An entry names, for each op type it runs, where its class lives (imported only when a case of
that type is prepared), what it needs installed and how to install it, what a worker warms
before its first case, and which package versions a run records. `run/` reads these hooks and
never switches on a backend's name. The user's own code (`py:FILE.py:FUNC`, `mod:PKG.MOD:FUNC@DIR`)
has an entry of its own kind; the registry (backends/registry.py) builds backends from here.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["BackendEntry", "BACKENDS", "BUILTIN_BACKENDS", "USER_SPEC_PREFIXES", "is_user_spec", "entry_for",
           "recorded_versions"]

USER_SPEC_PREFIXES = ("py:", "mod:")


def _attr(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class BackendEntry:
    name: str
    ops: Mapping[str, str] = field(default_factory=dict)
    """op type -> `module:Class` of the backend for it (imported when first asked for)."""
    requires: Optional[str] = None
    """A module that must be importable for the backend to run (checked before workers start)."""
    framework: str = ""
    """The framework's name as its users write it (`vLLM`), for messages."""
    install_hint: str = ""
    versions: tuple[str, ...] = ()
    """Distributions whose versions every run records (read from metadata, never imported)."""
    warm: Optional[str] = None
    """`module:function(backend_name, device_kind)` a worker calls once before its first case."""

    def missing(self) -> Optional[str]:
        """Why the backend cannot run here (its requirement is not installed), or None."""
        if self.requires is not None and importlib.util.find_spec(self.requires) is None:
            return (f"--backend {self.name}: {self.framework or self.requires} is not installed here; install it with "
                    f"{self.install_hint}")
        return None

    def factory(self, op_type: str) -> Optional[Callable[[], Any]]:
        path = self.ops.get(op_type)
        return None if path is None else _attr(path)

    def warm_up(self, device_kind: str) -> None:
        if self.warm is not None:
            _attr(self.warm)(self.name, device_kind)


BACKENDS: dict[str, BackendEntry] = {
    "torch": BackendEntry(
        "torch", {"gemm": "operatorx.backends.torch.gemm:TorchGemm", "moe": "operatorx.backends.torch.moe:TorchMoe",
                  "collective": "operatorx.backends.torch.collective:TorchCollective",
                  "gqa": "operatorx.backends.torch.attention:TorchGqa",
                  "mla": "operatorx.backends.torch.attention:TorchMla"},
        versions=("triton", "nvidia-cublas", "nvidia-cublas-cu12"), warm="operatorx.backends.torch.warm:warm"),
    "vllm": BackendEntry(
        "vllm", {"gemm": "operatorx.backends.vllm.gemm:VllmGemm", "moe": "operatorx.backends.vllm.moe:VllmMoe",
                 "collective": "operatorx.backends.vllm.collective:VllmCollective",
                 "gqa": "operatorx.backends.vllm.attention:VllmGqa",
                 "mla": "operatorx.backends.vllm.attention.mla:VllmMla",
                 "mla_dsa": "operatorx.backends.vllm.attention.dsa:VllmMlaDsa",
                 "dsv4_attn": "operatorx.backends.vllm.attention.dsv4:VllmDsv4",
                 "gdn": "operatorx.backends.vllm.attention.linear:VllmGdn"},
        requires="vllm", framework="vLLM", install_hint='pip install -e ".[vllm]" (or pip install "operatorx[vllm]")',
        versions=("vllm",), warm="operatorx.backends.vllm.env:warm"),
}
#: The backends that ship with OperatorX.
BUILTIN_BACKENDS = tuple(BACKENDS)


def is_user_spec(name: str) -> bool:
    return name.startswith(USER_SPEC_PREFIXES)


def entry_for(name: str) -> Optional[BackendEntry]:
    """The entry of a shipped backend or of the user's code; None for any other name."""
    if is_user_spec(name):
        return BackendEntry(name, warm="operatorx.backends.py_file:warm")
    return BACKENDS.get(name)


def recorded_versions() -> tuple[str, ...]:
    """The distributions a run's provenance lists, over every backend."""
    return tuple(dict.fromkeys(d for entry in BACKENDS.values() for d in entry.versions))
