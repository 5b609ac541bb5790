"""A row: one case's outcome. The run produces rows; the store and reports only read them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from operatorx.spec import Case

__all__ = ["Row", "Status", "SCHEMA_VERSION"]

SCHEMA_VERSION = "1"
Status = Literal["ok", "unsupported", "error"]


@dataclass(frozen=True)
class Row:
    case: Case
    backend: str
    status: Status
    testlist: str
    case_index: int
    message: Optional[str] = None
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def latency_us(self) -> Optional[float]:
        return self.metrics.get("latency_us")

    def to_json(self) -> dict[str, Any]:
        """The row as the result document carries it (case-format.md, "Results")."""
        out: dict[str, Any] = {
            "op": {"type": self.case.type, "args": self.case.args_dict(), "backend": self.backend,
                   "sources": list(self.case.sources)},
            "label": self.case.label(),
            "status": self.status,
            "testlist": self.testlist,
            "case_index": self.case_index,
            "metrics": self.metrics,
        }
        if self.message is not None:
            out["message"] = self.message
        return out
