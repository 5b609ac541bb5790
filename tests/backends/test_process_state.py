"""A backend's process state is given up, once and newest first, before the worker joins a rank group."""

from __future__ import annotations

from operatorx.backends import process_state


def test_registered_releases_run_once_newest_first():
    calls: list[str] = []

    def first() -> None:
        calls.append("first")

    def second() -> None:
        calls.append("second")

    process_state.on_group_change(first)
    process_state.on_group_change(second)
    process_state.on_group_change(first)            # registered once
    process_state.release_for_group()
    process_state.release_for_group()               # nothing left to release
    assert calls == ["second", "first"]
