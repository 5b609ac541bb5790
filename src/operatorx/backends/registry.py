"""Backends by (name, op type): the backend table (backends/names.py), plus any registered at run time.

Nothing registers on import: a shipped backend's class is imported when a case of its op type is
first prepared. `register_backend` adds one more (a test's, a plugin's); it refuses duplicates and
checks the protocol when the backend is built.
"""

from __future__ import annotations

from collections.abc import Callable

from operatorx.backends.base import Backend
from operatorx.backends.names import BACKENDS, BUILTIN_BACKENDS, is_user_spec

__all__ = ["register_backend", "get_backend", "backend_names", "known_backend_names", "BUILTIN_BACKENDS"]

_FACTORIES: dict[tuple[str, str], Callable[[], Backend]] = {}


def register_backend(name: str, op_type: str, factory: Callable[[], Backend]) -> None:
    key = (name, op_type)
    if key in _FACTORIES or op_type in (BACKENDS[name].ops if name in BACKENDS else {}):
        raise ValueError(f"backend {name!r} for {op_type!r} is registered twice")
    _FACTORIES[key] = factory


def get_backend(name: str, op_type: str) -> Backend | None:
    """The backend instance, or None when `name` has no `op_type` op.

    `py:PATH.py:FUNC` and `mod:PKG.MOD:FUNC@DIR` name user code (backends/py_file.py); a bad
    one raises ValueError.
    """
    if is_user_spec(name):
        from operatorx.backends.py_file import user_backend

        return user_backend(name, op_type)
    factory = _FACTORIES.get((name, op_type))
    if factory is None and name in BACKENDS:
        factory = BACKENDS[name].factory(op_type)
    if factory is None:
        return None
    backend = factory()
    if not isinstance(backend, Backend) or backend.name != name or backend.op_type != op_type:
        raise TypeError(f"backend factory for {name}/{op_type} returned {backend!r}, not a matching Backend")
    return backend


def backend_names() -> list[str]:
    return sorted(set(BUILTIN_BACKENDS) | {name for name, _ in _FACTORIES})


def known_backend_names() -> list[str]:
    """The backend names, without importing any backend (and so torch): what a sweep's parent
    checks a `--backend` against."""
    return backend_names()
