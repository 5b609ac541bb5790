"""A case prepared again at other device addresses, for `--placements N`.

The harness cannot move the tensors a backend holds (a vLLM layer's weights, scales, workspaces), so
the backend prepares the case again, each time behind a padding allocation of another size: every
copy's operands lie elsewhere, and the copies exist together, so their samples can be interleaved
(measure/placed.py). Backends draw their inputs from the case's seed, so each copy holds the same
data: only the addresses differ. Placement 0 is the case as first prepared, and the one checked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from operatorx.backends import Backend, Prepared, Unsupported
from operatorx.spec import Case

__all__ = ["PAD_UNIT_BYTES", "Placements", "add_placements", "pad_bytes"]

PAD_UNIT_BYTES = 2 << 20
"""The caching allocator's large-block granule: pads are whole multiples of it."""


def pad_bytes(placement: int) -> int:
    """Placement p's padding: (2^p − 1) × 2 MiB (0, 2, 6, 14 MiB...), so no two copies are offset
    from their predecessor by the same amount."""
    return (2 ** placement - 1) * PAD_UNIT_BYTES


@dataclass
class Placements:
    """The copies of one case (index = placement), the pads that moved them, and why fewer, if so."""

    prepared: list[Prepared]
    requested: int
    pad_bytes: list[int]
    fewer_why: Optional[str] = None
    _pads: list[Any] = field(default_factory=list, repr=False)

    def fns(self) -> list[Callable[[], Any]]:
        return [p.fn for p in self.prepared]

    def drop_pads(self) -> None:
        """Give the padding back (the copies themselves are released with the case's others)."""
        self._pads.clear()


def _is_oom(err: BaseException) -> bool:
    return "out of memory" in str(err).lower()


def add_placements(backend: Backend, case: Case, device: str, first: Prepared, count: int,
                   held: list[Prepared]) -> Placements:
    """`first` and up to `count − 1` more copies of the case, each appended to `held` as soon as it
    exists (the caller releases them). When the device has no room for another copy, the ones made
    are kept and `fewer_why` says why the rest are missing."""
    import torch

    out = Placements(prepared=[first], requested=count, pad_bytes=[0])
    for placement in range(1, count):
        nbytes = pad_bytes(placement)
        try:
            out._pads.append(torch.empty(nbytes, dtype=torch.uint8, device=device))
            copy = backend.prepare(case, device)
        except Unsupported as err:
            out.fewer_why = f"placement {placement + 1} of {count} not prepared: {err.reason}"
            break
        except (RuntimeError, MemoryError) as err:
            if not _is_oom(err) and not isinstance(err, MemoryError):
                raise
            out.fewer_why = f"placement {placement + 1} of {count} not prepared: out of memory"
            break
        held.append(copy)
        out.prepared.append(copy)
        out.pad_bytes.append(nbytes)
    return out
