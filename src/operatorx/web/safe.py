"""Text from rows made safe to show: terminal escapes stripped, JSON embeddable in a page.

HTML escaping itself is Jinja's (autoescape on) and the browser's (pages set text with
`textContent`, never `innerHTML`). What is left here: a message may carry ANSI colour codes or
other control characters a terminal would act on, and JSON placed inside `<script>` must not be
able to close the element.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

from markupsafe import Markup

__all__ = ["clean", "clean_text", "clean_json", "script_json", "shown_name", "MAX_NAME_CHARS"]

MAX_NAME_CHARS = 128
"""A run id longer than this is shown cut (with its digest): ids are free text in ingested documents."""

# CSI (colours, cursor moves), OSC (titles, hyperlinks) and lone two-byte escapes, then any other C0/C1
# control character except tab and newline.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?|\x9b[0-?]*[ -/]*[@-~]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_SCRIPT_UNSAFE = re.compile("[<>&\u2028\u2029]")


def clean_text(text: str) -> str:
    """The text without terminal escapes or control characters (tab and newline stay)."""
    if text.isprintable():          # the usual case, answered at C speed
        return text
    if "\x1b" in text or "\x9b" in text:
        text = _ANSI.sub("", text)
    return _CONTROL.sub("", text)


def _numbers_only(values: list[Any]) -> bool:
    """True for a list of finite numbers (the common case: samples), checked at C speed."""
    try:
        return math.isfinite(math.fsum(values))
    except (TypeError, OverflowError):
        return False


# In JSON text (ASCII, escaped), what a control character, a line separator or a C1 code looks like.
_SUSPECT = re.compile(r"\\(?:u00[0-9a-fA-F]{2}|u202[89]|[bfr])")


def clean(value: Any) -> Any:
    """A JSON value with every string (keys too) cleaned and every NaN or infinity made null.
    Most values need nothing: one C-speed encode says so, and the value comes back as it is."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (ValueError, TypeError):
        return _clean(value)
    return _clean(value) if _SUSPECT.search(text) else value


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {clean_text(str(k)): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if value and _numbers_only(list(value)):
            return list(value)
        return [_clean(v) for v in value]
    return value


def clean_json(value: Any) -> str:
    """`clean(value)` as compact JSON text, encoded once when nothing needs cleaning (the usual case)."""
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError):
        return json.dumps(_clean(value), separators=(",", ":"), allow_nan=False, default=str)
    if _SUSPECT.search(text):
        return json.dumps(_clean(value), separators=(",", ":"), allow_nan=False, default=str)
    return text


def script_json(value: Any) -> Markup:
    """JSON to place inside `<script type="application/json">`: `<`, `>`, `&` and the JS line
    separators are written as \\u escapes, so no string can end the element or start a comment."""
    text = clean_json(value)
    return Markup(_SCRIPT_UNSAFE.sub(lambda m: _SCRIPT_ESCAPES[m.group(0)], text))


def _visible(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown_name(name: str) -> str:
    """A name (a run id) as pages, links and file names use it, never the raw text of a document.

    The name itself when every character is printable and it fits in MAX_NAME_CHARS (every id
    OperatorX makes). Otherwise each unprintable character (controls, ESC, bidi overrides,
    zero-width and format characters, lone surrogates) is written as a visible escape (`\\x1b`),
    the text is cut to 100 characters, and `~` with 12 hex digits of the name's SHA-256 follow:
    names that differ only in what was escaped or cut still show, link and file apart."""
    if len(name) <= MAX_NAME_CHARS and name.isprintable():
        return name
    visible = "".join(ch if ch.isprintable() else _visible(ch) for ch in name)
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{visible[:100]}~{digest}"
