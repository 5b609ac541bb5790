"""Whether a backend name is the user's own code (`py:FILE.py:FUNC`, `mod:PKG.MOD:FUNC@DIR`), told
from the name alone: the CLI asks before it loads anything else (backends/py_file.py loads it)."""

from __future__ import annotations

__all__ = ["USER_SPEC_PREFIXES", "is_user_spec"]

USER_SPEC_PREFIXES = ("py:", "mod:")


def is_user_spec(name: str) -> bool:
    return name.startswith(USER_SPEC_PREFIXES)
