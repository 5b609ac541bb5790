"""Text every store, document and terminal can hold: lone surrogates and NUL replaced, free text capped.

Text reaches a row from outside: a backend's exception (an OSError about a file name that is not
UTF-8 carries lone surrogates, `'\\udcff'`), a worker's stderr, a library's metadata. Python keeps
such a string, but UTF-8 cannot encode it: SQLite's and psycopg's drivers raise UnicodeEncodeError,
PostgreSQL refuses NUL in `text` and both in `jsonb`. So a row is made storable once, when it is
built (`Row`, result.py), and the store's serializer holds the run records to the same rule
(store/writes.py). Each unstorable character becomes U+FFFD (the replacement character): the rest of
the text stays as it was, and the reader sees that something was there.

Control, escape and bidi characters stay in the data (a traceback's line breaks are its text); they
are escaped where text is shown (report/safe.py for terminals, Markdown and CSV).
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["REPLACEMENT", "MESSAGE_MAX_CHARS", "TEXT_MAX_CHARS", "storable", "storable_data", "capped",
           "storable_json", "all_storable"]

REPLACEMENT = "\ufffd"
#: A row's `message` (and each `failures` entry): one line a table shows; longer text is cut at the end.
MESSAGE_MAX_CHARS = 4_000
#: A traceback or a stderr tail: their last characters are kept (the end says what failed).
TEXT_MAX_CHARS = 32_000

_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")
#: What an unstorable character looks like in `json.dumps` output (ensure_ascii escapes it); an
#: escaped backslash before it (a literal `\u0000` in the text) only costs a needless clean.
_UNSTORABLE_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")


def storable(text: str) -> str:
    """`text` with each lone surrogate and NUL replaced by U+FFFD (the same object when none is there)."""
    return text if _UNSTORABLE.search(text) is None else _UNSTORABLE.sub(REPLACEMENT, text)


def all_storable(texts: list[str]) -> bool:
    """Whether every one of `texts` is storable as it is (one search over them all)."""
    return _UNSTORABLE.search("\x01".join(texts)) is None


def capped(text: str, max_chars: int, keep_end: bool = False) -> str:
    """`text` cut to at most `max_chars` characters, saying how many were left out; `keep_end` keeps
    the last characters (a traceback, a log tail), else the first."""
    if len(text) <= max_chars:
        return text
    note_len = 40
    kept = max(0, max_chars - note_len)
    dropped = len(text) - kept
    if keep_end:
        return f"[... {dropped:,} characters left out]\n" + text[len(text) - kept:]
    return text[:kept] + f" [... {dropped:,} characters left out]"


def storable_data(value: Any) -> Any:
    """JSON-like data (dicts, lists, strings, numbers) with every string and key made `storable`;
    the same object when nothing needed it (checked in one `json.dumps`, not a walk per value)."""
    if isinstance(value, str):
        return storable(value)
    if not isinstance(value, (dict, list, tuple)):
        return value
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError, RecursionError):
        text = "\\u0000"                            # cannot tell: walk it
    if _UNSTORABLE_ESCAPE.search(text) is None:
        return value
    return _walk(value)


def _walk(value: Any) -> Any:
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, dict):
        return {(storable(k) if isinstance(k, str) else k): _walk(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_walk(v) for v in value]
    return value


def storable_json(text: str, value: Any) -> str:
    """`text`, the `json.dumps` of `value`, or when it escapes an unstorable character the dumps of
    `value` made storable (what PostgreSQL's `jsonb` accepts and every reader can decode)."""
    if _UNSTORABLE_ESCAPE.search(text) is None:
        return text
    return json.dumps(_walk(value), allow_nan=False, default=str)
