"""Implementation facts by config `model_type` (implementations.json), shared by catalog and from_config."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any, Optional

__all__ = ["implementation_for"]


@cache
def _table() -> dict[str, dict[str, Any]]:
    data = json.loads((resources.files("operatorx.catalog") / "implementations.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def implementation_for(model_type: Optional[str]) -> dict[str, Any]:
    """The facts for `model_type` (a fresh dict), or {} for a type the table does not know."""
    entry = _table().get(model_type or "")
    return dict(entry["facts"]) if entry else {}
