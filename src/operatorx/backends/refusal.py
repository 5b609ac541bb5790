"""Tell a library's "no kernel for that" apart from a real failure, by its own words."""

from __future__ import annotations

from typing import Optional

__all__ = ["library_refusal"]

_REFUSAL_MARKERS = ("NOT_SUPPORTED", "not supported", "only supported", "not implemented",
                    "requires cublaslt", "Only bf16", "not available")


def library_refusal(err: BaseException) -> Optional[str]:
    """The library's message (first line) when the exception means it has no kernel for the case."""
    text = str(err).strip()
    first = text.splitlines()[0] if text else type(err).__name__
    if isinstance(err, NotImplementedError) or any(m.lower() in text.lower() for m in _REFUSAL_MARKERS):
        return first[:400]
    return None
