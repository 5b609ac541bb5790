"""The pydantic base every spec model shares: frozen, strict, no unknown keys.

Strict mode refuses "8" or 8.0 where an int belongs; floats still accept ints. NaN and ±infinity
are refused in every float field (a NaN limit or scale would only show up later as a NaN error).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["SpecModel"]


class SpecModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
