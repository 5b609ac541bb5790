"""Backends: one module per (framework, op), registered by name.

The names load on first use (`operatorx.lazy`): `operatorx.backends.names` tells the backend names
apart without loading the case models, which the CLI needs before a run spawns its workers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from operatorx.lazy import lazy_names

if TYPE_CHECKING:
    from operatorx.backends.base import Backend, Check, Prepared, Unsupported
    from operatorx.backends.refusal import library_refusal
    from operatorx.backends.registry import backend_names, get_backend, register_backend

__all__ = ["Backend", "Check", "Prepared", "Unsupported", "library_refusal", "backend_names", "get_backend",
           "register_backend"]

_HOME = {**{name: "operatorx.backends.base" for name in ("Backend", "Check", "Prepared", "Unsupported")},
         "library_refusal": "operatorx.backends.refusal",
         **{name: "operatorx.backends.registry" for name in ("backend_names", "get_backend", "register_backend")}}

__getattr__ = lazy_names(__name__, _HOME)
