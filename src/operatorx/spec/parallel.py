"""Where a per-rank shape came from: tensor, data and expert parallel sizes."""

from __future__ import annotations

from typing import Optional

from pydantic import PositiveInt

from operatorx.spec.base import SpecModel

__all__ = ["Parallel"]


class Parallel(SpecModel):
    """Metadata: shapes in a case are already per rank."""

    tp: PositiveInt = 1
    dp: Optional[PositiveInt] = None
    ep: Optional[PositiveInt] = None
