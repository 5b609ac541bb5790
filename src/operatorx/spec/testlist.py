"""Testlists: load with errors that name file, case and field; merge; dump; shipped lists by name."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from operatorx.spec.case import Case

__all__ = [
    "TestlistError", "load_testlist", "parse_cases", "merge_cases", "dump_testlist",
    "resolve_testlist", "shipped_testlists",
]


class TestlistError(ValueError):
    """A testlist that cannot be used; `problems` holds one line per bad field."""

    __test__ = False  # not a pytest class

    def __init__(self, problems: list[str]):
        self.problems = problems
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        super().__init__("\n".join(shown))


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(case)"


def parse_cases(data: Any, origin: str) -> list[Case]:
    """Validate decoded JSON as a testlist. Every problem is collected, then all are raised."""
    if not isinstance(data, list):
        raise TestlistError([f"{origin}: a testlist is a JSON array of cases, got {type(data).__name__}"])
    cases: list[Case] = []
    problems: list[str] = []
    for index, item in enumerate(data):
        if not isinstance(item, dict):
            what = "null" if item is None else type(item).__name__
            problems.append(f"{origin}: case {index}: a case is a JSON object, got {what}")
            continue
        try:
            cases.append(Case.model_validate(item))
        except ValidationError as err:
            for e in err.errors():
                msg = e["msg"].removeprefix("Value error, ")
                problems.append(f"{origin}: case {index}: {_loc(tuple(e['loc']))}: {msg}")
    if problems:
        raise TestlistError(problems)
    return cases


def load_testlist(path: str | os.PathLike[str]) -> list[Case]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise TestlistError([f"{path}: cannot read: {err.strerror or err}"]) from err
    except UnicodeDecodeError as err:
        raise TestlistError([f"{path}: not UTF-8 text (byte {err.start}): a testlist is a JSON file"]) from err
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise TestlistError([f"{path}: not JSON: line {err.lineno} column {err.colno}: {err.msg}"]) from err
    return parse_cases(data, str(path))


def merge_cases(cases: Iterable[Case]) -> list[Case]:
    """Dedupe by (type, args), first-seen order; the survivors carry the union of sources."""
    merged: dict[str, Case] = {}
    for case in cases:
        key = case.key()
        if key in merged:
            have = merged[key].sources
            extra = [s for s in case.sources if s not in have]
            if extra:
                merged[key] = merged[key].with_sources(have + extra)
        else:
            merged[key] = case
    return list(merged.values())


def dump_testlist(cases: Iterable[Case], path: str | os.PathLike[str]) -> None:
    """Write one case per line (diffable), atomically: a failure never leaves half a testlist."""
    path = Path(path)
    lines = [json.dumps(c.to_json(), separators=(", ", ": ")) for c in cases]
    text = "[\n" + ",\n".join(lines) + "\n]\n" if lines else "[]\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent or ".", prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a testlist is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def shipped_testlists() -> dict[str, Path]:
    """Testlists that ship with the package, by name (file stem)."""
    root = resources.files("operatorx") / "testlists"
    return {p.name[:-5]: Path(str(p)) for p in root.iterdir() if p.name.endswith(".json")}


def resolve_testlist(name_or_path: str) -> Path:
    """A path that exists wins; otherwise a shipped testlist by name."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = shipped_testlists()
    if name_or_path in shipped:
        return shipped[name_or_path]
    raise TestlistError([f"{name_or_path}: no such file, and no shipped testlist of that name "
                         f"(shipped: {', '.join(sorted(shipped)) or 'none'})"])
