"""The pydantic base every spec model shares: frozen, strict, no unknown keys; and the integer types
of every size, count and seed.

Strict mode refuses "8" or 8.0 where an int belongs; floats still accept ints. NaN and ±infinity
are refused in every float field (a NaN limit or scale would only show up later as a NaN error).

Every integer of a case is at most MAX_INT64 = 2^63 - 1: the widest integer both result stores hold
(SQLite INTEGER, PostgreSQL BIGINT), so a case that validates is a case the store can hold; a larger
one is refused in the testlist with its field named, never as an overflow half-way through a run.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SpecModel", "MAX_INT64", "Size", "Count", "Int64", "too_large"]

#: The largest integer a case may hold: a signed 64-bit integer's maximum.
MAX_INT64 = 2**63 - 1

Size = Annotated[int, Field(gt=0, le=MAX_INT64)]
"""A positive size (a dimension, a number of experts or heads): 1 to 2^63 - 1."""
Count = Annotated[int, Field(ge=0, le=MAX_INT64)]
"""A non-negative count or seed (zero experts, a context length, a seed): 0 to 2^63 - 1."""
Int64 = Annotated[int, Field(ge=-MAX_INT64 - 1, le=MAX_INT64)]
"""Any integer a signed 64-bit column holds."""


def too_large(value: object) -> str:
    """The refusal of an integer above MAX_INT64, as the testlist reader words it."""
    return (f"{value} is above 2^63 - 1 = {MAX_INT64}, the largest integer the results databases hold "
            "(SQLite INTEGER, PostgreSQL BIGINT)")


class SpecModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
