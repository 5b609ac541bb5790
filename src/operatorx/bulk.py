"""Work that makes many long-lived objects at once (a testlist's cases, a run's planned rows): the
cyclic garbage collector paused while it lasts.

CPython's collector runs after every 700 new container objects and, every so often, scans every
object still alive; building 10^5 validated cases kept it scanning the ones built before: a third
of `testlist validate`'s time at 10^5 cases and two thirds of it at 10^6 (docs/benchmarks.md,
"Scale of a testlist"). The objects built here hold no reference cycles, so reference counting
frees whatever is dropped; the collector resumes when the outermost pause ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off inside the block, back on after it if it was on before
    (so pauses nest, and a caller that turned it off keeps it off)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
