"""Backends: one module per (framework, op), registered by name."""

from operatorx.backends.base import Backend, Check, Prepared, Unsupported
from operatorx.backends.refusal import library_refusal
from operatorx.backends.registry import backend_names, get_backend, register_backend

__all__ = ["Backend", "Check", "Prepared", "Unsupported", "library_refusal", "backend_names", "get_backend",
           "register_backend"]
