"""Backend names, told apart without loading any backend: the shipped ones, and the user's own code
(`py:FILE.py:FUNC`, `mod:PKG.MOD:FUNC@DIR`). The CLI and the sweep's parent ask before they spawn
workers; the registry (backends/registry.py) and the user-code loader (backends/py_file.py) use the same."""

from __future__ import annotations

__all__ = ["BUILTIN_BACKENDS", "USER_SPEC_PREFIXES", "is_user_spec"]

#: The backends that ship with OperatorX (registered when first asked for).
BUILTIN_BACKENDS = ("torch", "vllm")
USER_SPEC_PREFIXES = ("py:", "mod:")


def is_user_spec(name: str) -> bool:
    return name.startswith(USER_SPEC_PREFIXES)
