"""Where operatorx keeps what it caches for a user between runs (measured peaks, compiled bytecode):
one root, so a user who moves or clears it finds everything in one place."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["cache_root"]


def cache_root(env: Mapping[str, str]) -> Path:
    """`$XDG_CACHE_HOME/operatorx`, else `~/.cache/operatorx`."""
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "operatorx"
