"""How a prepared case is checked against its fp32 reference: the error measure and the bounds.

One place, so every backend (and `py:` user code checked on the torch backend's inputs) judges
an output the same way.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CHECK_ROWS", "REL_ERROR_BOUND", "rel_error"]

#: Rows of the output compared with the reference: enough to cover every K block and every
#: column, few enough that the fp32 reference stays cheap for prefill shapes.
CHECK_ROWS = 256
#: ||out - ref|| / ||ref|| allowed, by output dtype: the output's rounding dominates.
REL_ERROR_BOUND = {"bf16": 1e-2, "fp16": 2e-3, "fp32": 1e-4}


def rel_error(out: Any, ref: Any) -> float:
    """||out - ref||_F / ||ref||_F in fp32 (NaN anywhere gives NaN, which no bound passes)."""
    return float((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))
