"""Backends by (name, op type). Registration checks the protocol and refuses duplicates."""

from __future__ import annotations

from collections.abc import Callable

from operatorx.backends.base import Backend
from operatorx.backends.names import BUILTIN_BACKENDS, is_user_spec

__all__ = ["register_backend", "get_backend", "backend_names", "known_backend_names", "BUILTIN_BACKENDS"]

_FACTORIES: dict[tuple[str, str], Callable[[], Backend]] = {}
_LOADED = False


def register_backend(name: str, op_type: str, factory: Callable[[], Backend]) -> None:
    key = (name, op_type)
    if key in _FACTORIES:
        raise ValueError(f"backend {name!r} for {op_type!r} is registered twice")
    _FACTORIES[key] = factory


def _load_builtins() -> None:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        from operatorx.backends import torch as _torch  # noqa: F401  (registers on import)
        from operatorx.backends import vllm as _vllm  # noqa: F401  (imports vLLM only when a case is prepared)


def get_backend(name: str, op_type: str) -> Backend | None:
    """The backend instance, or None when `name` has no `op_type` op.

    `py:PATH.py:FUNC` and `mod:PKG.MOD:FUNC@DIR` name user code (backends/py_file.py); a bad
    one raises ValueError.
    """
    if is_user_spec(name):
        from operatorx.backends.py_file import user_backend

        return user_backend(name, op_type)
    _load_builtins()
    factory = _FACTORIES.get((name, op_type))
    if factory is None:
        return None
    backend = factory()
    if not isinstance(backend, Backend) or backend.name != name or backend.op_type != op_type:
        raise TypeError(f"backend factory for {name}/{op_type} returned {backend!r}, not a matching Backend")
    return backend


def backend_names() -> list[str]:
    _load_builtins()
    return sorted({name for name, _ in _FACTORIES})


def known_backend_names() -> list[str]:
    """The names `backend_names` gives, without importing the built-in backends (and so torch):
    what a sweep's parent process checks a `--backend` against."""
    return sorted(set(BUILTIN_BACKENDS) | {name for name, _ in _FACTORIES})
