"""What a backend is: it says whether it can really run a case here, and prepares it.

Everything slow or one-off (allocation, weight quantization, kernel choice) happens in
`prepare`, outside the timed region; `Prepared.fn` is the one call that gets timed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, runtime_checkable

from operatorx.spec import Case

__all__ = ["Unsupported", "Check", "Prepared", "Backend"]


class Unsupported(Exception):
    """This case has no real kernel here; the message is the reason the row will carry."""

    @property
    def reason(self) -> str:
        return str(self)


@dataclass(frozen=True)
class Check:
    """The outcome of comparing the op's output with an fp32 reference once."""

    rel_error: float          # ||out - ref||_F / ||ref||_F over the rows checked
    bound: float
    rows_checked: int
    reference: str            # what the reference computed, in words

    @property
    def ok(self) -> bool:
        return self.rel_error <= self.bound  # NaN compares False: a NaN output never passes

    def to_json(self) -> dict[str, Any]:
        return {"rel_error": self.rel_error, "bound": self.bound, "rows_checked": self.rows_checked,
                "reference": self.reference, "ok": self.ok}


@dataclass
class Prepared:
    """A case ready to time: `fn` is the timed call; `check` runs once before timing."""

    fn: Callable[[], Any]
    check: Callable[[], Check]
    metadata: dict[str, Any] = field(default_factory=dict)
    release: Optional[Callable[[], None]] = None
    min_bytes: Optional[int] = None
    """Bytes the call must move when the backend knows better than the case alone
    (an MoE layer: the experts its routing actually hit). None: `case.min_bytes()`."""


@runtime_checkable
class Backend(Protocol):
    name: str
    op_type: str

    def supports(self, case: Case, device: str) -> Optional[str]:
        """None when the case can really run on `device`; else the reason it cannot."""

    def prepare(self, case: Case, device: str) -> Prepared:
        """Allocate and set up; raise `Unsupported` when the library refuses the case."""
