"""The store's two exceptions. A StoreError's message is one line that names the problem and the fix."""

from __future__ import annotations

__all__ = ["StoreError", "RunNotFound"]


class StoreError(Exception):
    """The database cannot be used as asked: bad URL, missing driver, unreachable server, not a
    database, corrupt, not writable, schema too old or too new. The message says what to do.

    `file_unusable`: the SQLite file itself is not a database or is corrupt, so no other program can
    be using it; only then may a failed open tidy up the -wal/-shm files it made beside it."""

    def __init__(self, message: str, *, file_unusable: bool = False):
        super().__init__(message)
        self.file_unusable = file_unusable


class RunNotFound(LookupError):
    """No run matches the id, prefix or `latest` asked for (or a prefix matches several)."""
