"""Make any string safe for where it is printed: the terminal, Markdown, CSV.

Strings that reach output come from outside: backend messages (torch's `[enforce fail at ...]`),
user file names (`inj[v2].json`), `py:` specs (`b.py:ok[x=1]`), testlist keys (`[/red]`).
- `term()`: for rich output. Control characters, ANSI/OSC escape sequences and bidi overrides are
  removed, then rich markup is escaped, so `[x]` prints as `[x]` and never styles or raises.
- `plain()`: the same cleaning without markup escaping, for `typer.echo` and other plain writes.
- `md_cell()`: one Markdown table cell: `|` escaped, line breaks to spaces, `<`, `>` and `&` as
  HTML entities (a renderer shows the text, never runs `<script>` or `<img onerror>`), link and
  image brackets, backticks and URL autolinks escaped (shown as text, never followed or loaded).
- `csv_cell()`: a cell a spreadsheet reads as data: a text starting with `=`, `+`, `-`, `@`, tab
  or CR gets a leading `'` (OWASP's formula-injection advice); lists and dicts are JSON.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rich.markup import escape

__all__ = ["term", "plain", "md_cell", "csv_cell", "strip_control"]

# ESC [ ... final (CSI), ESC ] ... BEL or ESC \ (OSC), ESC P/X/^/_ ... ESC \ (DCS, SOS, PM, APC),
# then any other two-character ESC sequence, then single C0/C1 controls and bidi/format overrides.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[@-Z\\-_]?"
    r"|\x9b[0-?]*[ -/]*[@-~]"
)
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_LINE_BREAKS = re.compile(r"\r\n|[\r\n\t\u2028\u2029\x0b\x0c\x85]")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def strip_control(text: str, keep_newlines: bool = False) -> str:
    """`text` without escape sequences and control characters; line breaks become spaces unless kept."""
    text = _ESCAPES.sub("", text)
    if keep_newlines:
        text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", " ")
    else:
        text = _LINE_BREAKS.sub(" ", text)
    return _CONTROLS.sub("", text)


def plain(value: Any, keep_newlines: bool = False) -> str:
    """`str(value)` cleaned of control characters, for plain (non-markup) output."""
    return strip_control("" if value is None else str(value), keep_newlines)


def term(value: Any, keep_newlines: bool = False) -> str:
    """`str(value)` cleaned and markup-escaped, for anything printed through rich.

    rich's `escape` doubles a trailing backslash (so that markup appended after it stays markup);
    that prints as two backslashes, so here a trailing backslash stays single. Put markup after a
    `term()` string only behind a space.
    """
    text = plain(value, keep_newlines)
    escaped = escape(text)
    doubled = text.endswith("\\") and not text.endswith("\\\\") and escaped.endswith("\\\\")
    return escaped[:-1] if doubled else escaped


_MD_PUNCT = re.compile(r"[\\|\[\]`]")
_URL_SCHEME = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{1,31}):(?=//)")
_WWW = re.compile(r"(?i)\b(www)\.")


def md_cell(value: Any) -> str:
    """One Markdown table cell that a Markdown viewer shows as the text itself, never as a link,
    an image, markup or HTML: no line breaks; `&`, `<`, `>` as HTML entities (no raw HTML, no
    `<http://...>` autolink); `\\`, `|`, `[`, `]` and backticks escaped (no table break, no
    `[text](url)` or `![img](url)`, no code span); and the `:` of `scheme://` and the `.` of `www.`
    escaped, so GitHub's autolink extension finds no URL. (An e-mail address may still be linked
    there: cmark-gfm finds those whatever is escaped.)"""
    text = plain(value)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _MD_PUNCT.sub(lambda m: "\\" + m.group(0), text)
    text = _URL_SCHEME.sub(lambda m: m.group(1) + "\\:", text)
    return _WWW.sub(lambda m: m.group(1) + "\\.", text)


def csv_cell(value: Any) -> Any:
    """A CSV cell: numbers and None as they are, lists/dicts as JSON, formula-looking text neutralised."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (list, tuple, dict)):
        value = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    text = _ESCAPES.sub("", str(value))
    text = _CONTROLS.sub("", text)
    return "'" + text if text.startswith(_FORMULA_START) else text
