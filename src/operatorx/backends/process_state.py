"""Process-wide state a backend built for single-device cases and must give up before the worker joins a
multi-rank group.

vLLM's layers need a torch.distributed world even on one device, so its backend makes a one-rank
world in the worker. A worker that then becomes a rank of a W-rank case must leave that world first
(torch holds one default group per process). A backend registers how to leave with
`on_group_change`; the rank group calls `release_for_group()` before it forms.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["on_group_change", "release_for_group"]

_RELEASES: list[Callable[[], None]] = []


def on_group_change(release: Callable[[], None]) -> None:
    """Call `release` (once) before this process joins a multi-rank group."""
    if release not in _RELEASES:
        _RELEASES.append(release)


def release_for_group() -> None:
    """Give up every registered backend's process state, most recent first."""
    while _RELEASES:
        _RELEASES.pop()()
