"""The errors and warnings of testlists, in a module of their own: the CLI catches TestlistError
before a run has loaded anything, and importing the case models for that cost every command their
import time."""

from __future__ import annotations

__all__ = ["MAX_PROBLEMS_SHOWN", "TestlistError", "TestlistWarning"]

#: Problems a TestlistError shows (1,000 bad cases are not 1,000 lines on screen).
MAX_PROBLEMS_SHOWN = 20


class TestlistError(ValueError):
    """A testlist that cannot be used.

    `problems` holds one line per bad field, at most MAX_PROBLEMS_SHOWN of them and then one
    `... and N more` line; `all_problems` holds every line.
    """

    __test__ = False  # not a pytest class

    def __init__(self, problems: list[str]):
        self.all_problems = problems
        extra = len(problems) - MAX_PROBLEMS_SHOWN
        self.problems = problems[:MAX_PROBLEMS_SHOWN] + ([f"... and {extra} more"] if extra > 0 else [])
        super().__init__("\n".join(self.problems))


class TestlistWarning(UserWarning):
    """Something in a testlist that loads but is worth a line: e.g. an unknown top-level key."""

    __test__ = False
