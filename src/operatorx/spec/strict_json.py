"""Strict JSON for testlists: what Python's `json` accepts and JSON does not, refused with a place.

Python's decoder takes `NaN`/`Infinity`, keeps the last of two equal keys, recurses once per
nesting level (a deep file raises RecursionError), converts integers of any length (5,000
digits raise ValueError) and decodes `\\ud800` to a lone surrogate that no output can encode.
Here each of those is one problem line naming the file, the case index and the field, like
every other testlist error.

How: the decoder's hooks mark bad values (NaN, too-long numbers) and duplicate keys instead of
raising; the nesting depth is read from the brackets outside strings; a walk over the result then
turns each mark into a problem with its JSON path. The walk, and the exact scan that names where a
file nests too deeply, run only when something is wrong: on a good file every check is a regular
expression or a C loop, so 10^5 cases load in about a second (docs/benchmarks.md).
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


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    marked = _Object(obj)          # a key given twice: remember which (the last value is kept, as before)
    marked.duplicates = []
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen and key not in marked.duplicates:
            marked.duplicates.append(key)
        seen.add(key)
    return marked


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


_STRING = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+"', re.DOTALL)   # possessive: no backtracking state
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_LEAF_PAIR = re.compile(r"\[\]|\{\}")


def _deeper_than(text: str, limit: int) -> bool:
    """Whether valid JSON `text` nests deeper than `limit`, from its brackets outside strings: each
    pass removes every innermost `[]` / `{}` pair, so a text that is not empty after `limit` passes
    nests deeper. All in C (regular expressions), where the exact scan is a Python loop per token."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    for _ in range(limit):
        if not brackets:
            return False
        brackets, removed = _LEAF_PAIR.subn("", brackets)
        if not removed:
            return True                 # not balanced: the exact scan says where
    return bool(brackets)


def _path(parts: list[Any]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{shown(part)}" if out else shown(part))
    return out


_SURROGATE = re.compile(r"[\ud800-\udfff]")
#: A surrogate in the text, or an escape that may decode to one: only then are strings searched.
_MAYBE_SURROGATE = re.compile(r"[\ud800-\udfff]|\\u[dD][89a-fA-F]")
_NOT_TEXT = "holds a lone UTF-16 surrogate (an escape such as \\ud800 that is half a character): not text"


def _may_hold_surrogates(text: str) -> bool:
    """Whether a string decoded from `text` may hold a lone surrogate: only from a `\\u` escape or a
    surrogate already in the text (both checks in C; most testlists have neither)."""
    if text.isascii() and "\\u" not in text:
        return False
    return _MAYBE_SURROGATE.search(text) is not None


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


def _depth_problem(text: str, origin: str) -> StrictJSONError | None:
    deep = _check_depth(text)
    return None if deep is None else StrictJSONError([f"{origin}: {deep}"])


_CONTAINERS = (dict, list)
#: The smallest integers whose literal is longer than MAX_NUMBER_CHARS (41 digits; "-" and 40 digits).
_LONG_INT = (10**MAX_NUMBER_CHARS, -(10 ** (MAX_NUMBER_CHARS - 1)))


def _shape(data: Any, limit: int) -> tuple[int, int, int, bool]:
    """(keys in every object, colons inside its keys and strings, nesting depth, whether an integer's
    literal is longer than MAX_NUMBER_CHARS) of decoded JSON, level by level; the depth stops
    counting past `limit`."""
    keys = colons = depth = 0
    long_int = False
    top, bottom = _LONG_INT
    level = [data] if type(data) in _CONTAINERS else []
    while level and depth <= limit:
        depth += 1
        below: list[Any] = []
        for container in level:
            if type(container) is dict:
                keys += len(container)
                for key in container:
                    if ":" in key:
                        colons += key.count(":")
                values = container.values()
            else:
                values = container
            for value in values:
                kind = type(value)
                if kind is str:
                    if ":" in value:
                        colons += value.count(":")
                elif kind is int:
                    if value >= top or value <= bottom:
                        long_int = True
                elif kind is dict or kind is list:
                    below.append(value)
        level = below
    return keys, colons, depth, long_int


def loads_strict(text: str, origin: str) -> Any:
    """Decode `text` as strict JSON; StrictJSONError lists every place it is not, one line each.

    Lines read `ORIGIN: case I: FIELD: why` when the document is an array (a testlist), else
    `ORIGIN: FIELD: why`. Nesting deeper than MAX_DEPTH is reported before anything else.

    A good file is read with the plain decoder and checked whole: it has no `\\u` escape (so no
    surrogate, and every colon of a decoded string is one of the text's), no number too long (a
    float's literal is checked as it is read, an integer's by its value), no key given twice (the
    text's colons are as many as the decoded objects' keys plus the colons inside their strings),
    and it nests no deeper than MAX_DEPTH. Only a file that fails one of these is decoded again with
    the marking hooks, to say what and where (`_loads_marked`): the hooks are a Python call per
    object and number, most of the time of reading 10^5 cases, and a regular expression that blanked
    every string took 8 s of 10^6.
    """
    if "\\u" in text or (not text.isascii() and _SURROGATE.search(text)):
        return _loads_marked(text, origin)
    marked: list[bool] = []

    def constant(name: str) -> _Bad:
        marked.append(True)
        return _constant(name)

    def number(digits: str) -> Any:
        value = _float(digits)
        if isinstance(value, _Bad):
            marked.append(True)
        return value

    try:
        data = json.loads(text, parse_constant=constant, parse_float=number)
    except (ValueError, RecursionError):           # not JSON, too deep, an integer of 4,300+ digits
        return _loads_marked(text, origin)         # it says what is wrong, and where
    keys, colons, depth, long_int = _shape(data, MAX_DEPTH)
    if marked or long_int or depth > MAX_DEPTH or keys + colons != text.count(":"):
        return _loads_marked(text, origin)
    return data


def _loads_marked(text: str, origin: str) -> Any:
    """`loads_strict` through the decoder's hooks, which mark every bad value and repeated key."""
    marked: list[bool] = []

    def constant(name: str) -> _Bad:
        marked.append(True)
        return _constant(name)

    def integer(digits: str) -> Any:
        if len(digits) > MAX_NUMBER_CHARS:
            marked.append(True)
        return _int(digits)

    def number(digits: str) -> Any:
        value = _float(digits)
        if isinstance(value, _Bad):
            marked.append(True)
        return value

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = _pairs(items)
        if isinstance(obj, _Object):
            marked.append(True)
        return obj

    try:
        data = json.loads(text, object_pairs_hook=pairs, parse_constant=constant, parse_int=integer,
                          parse_float=number)
    except json.JSONDecodeError as err:
        deep = _depth_problem(text, origin)
        if deep is not None:
            raise deep from err
        raise StrictJSONError([f"{origin}: not JSON: line {err.lineno} column {err.colno}: {err.msg}"]) from err
    except RecursionError as err:   # deeper than Python's recursion limit: the scan says where
        deep = _depth_problem(text, origin)
        raise (deep or StrictJSONError([f"{origin}: nested too deeply to read"])) from err
    if _deeper_than(text, MAX_DEPTH):
        deep = _depth_problem(text, origin)
        if deep is not None:
            raise deep
    if not marked and not _may_hold_surrogates(text):
        return data
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
