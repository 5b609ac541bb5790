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
    checked: bool = True
    """False when nothing was compared (a user implementation with no reference): the row then
    says so instead of claiming a result that was never verified."""

    @property
    def ok(self) -> bool:
        if not self.checked:
            return True                      # nothing to fail; `checked: false` carries the caveat
        return self.rel_error <= self.bound  # NaN compares False: a NaN output never passes

    @classmethod
    def not_checked(cls, why: str) -> Check:
        return cls(rel_error=float("nan"), bound=float("nan"), rows_checked=0, reference=why, checked=False)

    def to_json(self) -> dict[str, Any]:
        if not self.checked:
            return {"checked": False, "reference": self.reference, "ok": None}
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
    layers: dict[str, Callable[[], Any]] = field(default_factory=dict)
    """Deeper entry points of the same op on the same inputs, by name (public API, the op called
    directly, a graph replay...), so host time can be split by layer (`run --host`). Optional."""


@runtime_checkable
class Backend(Protocol):
    name: str
    op_type: str

    def supports(self, case: Case, device: str) -> Optional[str]:
        """None when the case can really run on `device`; else the reason it cannot."""

    def prepare(self, case: Case, device: str) -> Prepared:
        """Allocate and set up; raise `Unsupported` when the library refuses the case."""
