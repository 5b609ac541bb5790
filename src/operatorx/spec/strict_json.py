"""Strict JSON for testlists: what Python's `json` accepts and JSON does not, refused with a place.

Python's decoder takes `NaN`/`Infinity`, keeps the last of two equal keys, recurses once per
nesting level (a deep file raises RecursionError), converts integers of any length (5,000
digits raise ValueError) and decodes `\\ud800` to a lone surrogate that no output can encode.
Here each of those is one problem line naming the file, the case index and the field, like
every other testlist error.

How: a cheap scan bounds the nesting depth before decoding; the decoder's hooks mark bad values
(NaN, too-long numbers) and duplicate keys instead of raising; a walk over the result then turns
each mark into a problem with its JSON path.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_NUMBER_CHARS", "StrictJSONError", "loads_strict", "shown"]

#: Nesting levels a testlist may use; a real case needs about 8 (case → args → experts → w1 → scale → group).
MAX_DEPTH = 32
#: Characters of one number literal; 64-bit integers need 20, any float fewer than 30.
MAX_NUMBER_CHARS = 40

_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},]', re.DOTALL)


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def shown(text: str) -> str:
    """A key or value as it may appear in a message: control characters as `\\xNN`/`\\uNNNN` escapes
    (an ESC in a key must not recolour the terminal that prints the error)."""
    return _UNPRINTABLE.sub(lambda m: json.dumps(m.group())[1:-1].replace("\\u00", "\\x"), text)


class StrictJSONError(ValueError):
    """One or more places where a file is not strict JSON; `problems` is one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class _Bad:
    """A value the decoder hook refused; the walk reports it with its path."""

    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why


class _Object(dict[str, Any]):
    """A decoded object that remembers keys given twice."""

    duplicates: list[str]


def _pairs(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object()
    obj.duplicates = []
    for key, value in pairs:
        if key in obj and key not in obj.duplicates:
            obj.duplicates.append(key)
        obj[key] = value
    return obj


def _constant(name: str) -> _Bad:
    return _Bad(f"{name} is not a JSON number (write a finite number)")


def _int(text: str) -> Any:
    if len(text) > MAX_NUMBER_CHARS:
        return _Bad(f"an integer of {len(text)} digits; numbers here have at most {MAX_NUMBER_CHARS}")
    return int(text)


def _float(text: str) -> Any:
    if len(text) > MAX_NUMBER_CHARS:
        return _Bad(f"a number of {len(text)} characters; numbers here have at most {MAX_NUMBER_CHARS}")
    value = float(text)
    if value in (float("inf"), float("-inf")):
        return _Bad(f"{text[:20]} overflows to infinity (write a finite number)")
    return value


def _line_col(text: str, pos: int) -> tuple[int, int]:
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def _check_depth(text: str) -> str | None:
    """None, or where the text nests deeper than MAX_DEPTH (with the top-level item it is in)."""
    depth, item = 0, 0
    for match in _TOKEN.finditer(text):
        tok = match.group()
        if tok in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                line, col = _line_col(text, match.start())
                where = f"case {item}: " if text.lstrip().startswith("[") else ""
                return (f"{where}nested deeper than {MAX_DEPTH} levels (line {line} column {col}); "
                        "a case needs about 8")
        elif tok in "]}":
            depth -= 1
        elif tok == "," and depth == 1:
            item += 1
    return None


def _path(parts: list[Any]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{shown(part)}" if out else shown(part))
    return out


_SURROGATE = re.compile(r"[\ud800-\udfff]")
_NOT_TEXT = "holds a lone UTF-16 surrogate (an escape such as \\ud800 that is half a character): not text"


def _walk(value: Any, parts: list[Any], found: list[tuple[list[Any], str]]) -> None:
    if isinstance(value, _Bad):
        found.append((parts, value.why))
    elif isinstance(value, str):
        if _SURROGATE.search(value):
            found.append((parts, _NOT_TEXT))
    elif isinstance(value, dict):
        for key in getattr(value, "duplicates", ()):
            found.append(([*parts, key], "key given twice in one object; JSON keeps only one of them"))
        for key, item in value.items():
            if _SURROGATE.search(key):
                found.append(([*parts, key], "this key " + _NOT_TEXT))
            _walk(item, [*parts, key], found)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _walk(item, [*parts, i], found)


def _strip(value: Any) -> Any:
    """Plain dicts again (the walk found nothing bad, so no _Bad is left)."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def loads_strict(text: str, origin: str) -> Any:
    """Decode `text` as strict JSON; StrictJSONError lists every place it is not, one line each.

    Lines read `ORIGIN: case I: FIELD: why` when the document is an array (a testlist), else
    `ORIGIN: FIELD: why`.
    """
    deep = _check_depth(text)
    if deep is not None:
        raise StrictJSONError([f"{origin}: {deep}"])
    try:
        data = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant, parse_int=_int,
                          parse_float=_float)
    except json.JSONDecodeError as err:
        raise StrictJSONError([f"{origin}: not JSON: line {err.lineno} column {err.colno}: {err.msg}"]) from err
    except RecursionError as err:   # the scan bounds depth; this is a second guard
        raise StrictJSONError([f"{origin}: nested too deeply to read"]) from err
    found: list[tuple[list[Any], str]] = []
    _walk(data, [], found)
    if not found:
        return _strip(data)
    problems = []
    for parts, why in found:
        if isinstance(data, list) and parts:
            rest = _path(parts[1:]) or "(case)"
            problems.append(f"{origin}: case {parts[0]}: {rest}: {why}")
        else:
            problems.append(f"{origin}: {_path(parts) or '(document)'}: {why}")
    raise StrictJSONError(problems)
