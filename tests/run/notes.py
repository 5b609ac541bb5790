"""A run reporter for tests: it keeps the cases it was told were done and the notes it was given."""

from __future__ import annotations

from operatorx.run.sweep import _Silent


class Notes(_Silent):
    """A reporter that keeps what it was told."""

    def __init__(self) -> None:
        self.done: list[tuple[str, int]] = []
        self.notes: list[str] = []

    def case_done(self, slot, row) -> None:
        self.done.append((slot, row.case_index))

    def note(self, text: str) -> None:
        self.notes.append(text)
