"""Testlists: load with errors that name file, case and field; merge; dump; shipped lists by name."""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Optional

from pydantic import ValidationError

from operatorx.bulk import gc_paused
from operatorx.spec.base import MAX_INT64, too_large
from operatorx.spec.case import Case
from operatorx.spec.errors import MAX_PROBLEMS_SHOWN, TestlistError, TestlistWarning
from operatorx.spec.strict_json import StrictJSONError, loads_strict, shown

__all__ = [
    "TestlistError", "TestlistWarning", "load_testlist", "parse_cases", "merge_cases", "merge_indexed",
    "dump_testlist", "resolve_testlist", "shipped_testlists", "old_format", "read_json", "read_testlist",
    "Testlist", "CASE_KEYS", "MAX_PROBLEMS_SHOWN",
]

#: The largest testlist read (the shipped full list is about 1.4 MB).
MAX_FILE_BYTES = 256 << 20
#: The top-level keys of a case the format defines; others are metadata (a warning, kept as written).
CASE_KEYS = ("type", "args", "sources", "name", "recipes", "count", "step", "metadata")


def _warn(message: str) -> None:
    warnings.warn(message, TestlistWarning, stacklevel=3)


def old_format(item: Any) -> Optional[str]:
    """The older flat format a case is in ("moe_gemm" or "gemm"), or None.

    Old gemm cases give `dtype_a`/`dtype_b`/`dtype_out` strings instead of operand descriptors;
    old MoE cases are `type: moe_gemm` with flat args (num_tokens, intermediate, ...).
    """
    if not isinstance(item, dict):
        return None
    if item.get("type") == "moe_gemm":
        return "moe_gemm"
    args = item.get("args")
    if item.get("type") == "gemm" and isinstance(args, dict) and {"dtype_a", "dtype_b", "dtype_out"} & set(args):
        return "gemm"
    return None


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{shown(str(part))}" if out else shown(str(part)))
    return out or "(case)"


def _old_format_problem(data: list[Any], origin: str) -> Optional[str]:
    old = [(i, kind) for i, item in enumerate(data) if (kind := old_format(item)) is not None]
    if not old:
        return None
    first, kind = old[0]
    what = "type moe_gemm" if kind == "moe_gemm" else "gemm with dtype_a/dtype_b/dtype_out"
    return (f"{origin}: case {first}: the older flat format ({what}; {len(old)} of {len(data)} cases); "
            f"convert the file: operatorx testlist upgrade {origin} -o NEW.json")


def _split_metadata(item: dict[str, Any], origin: str, index: int,
                    warn: Callable[[str], None]) -> dict[str, Any]:
    """Unknown top-level keys move into `metadata` (kept, never measured), each with a warning."""
    unknown = [k for k in item if k not in CASE_KEYS]
    if not unknown:
        return item
    known = {k: v for k, v in item.items() if k in CASE_KEYS}
    meta = known.get("metadata", {})
    meta = dict(meta) if isinstance(meta, dict) else meta
    if isinstance(meta, dict):
        for key in unknown:
            warn(f"{origin}: case {index}: {shown(key)}: not a case field; kept as metadata, never measured "
                 f"(fields: {', '.join(CASE_KEYS)})")
            meta[key] = item[key]
    return {**known, "metadata": meta}


def parse_cases(data: Any, origin: str, on_warning: Optional[Callable[[str], None]] = None) -> list[Case]:
    """Validate decoded JSON as a testlist. Every problem is collected, then all are raised.

    Unknown top-level keys of a case are metadata: kept, and each reported through `on_warning`
    (default: a TestlistWarning). Unknown keys inside `args` stay errors: a typo there would
    change what is measured.
    """
    return _parse(data, origin, on_warning, owned=False)


def _parse(data: Any, origin: str, on_warning: Optional[Callable[[str], None]], owned: bool) -> list[Case]:
    """parse_cases; `owned`: `data` is this call's own, and each entry is dropped once validated (10^6
    decoded entries held 1.3 GB beside the cases made from them)."""
    warn = on_warning or _warn
    if not isinstance(data, list):
        raise TestlistError([f"{origin}: a testlist is a JSON array of cases, got {type(data).__name__}"])
    old = _old_format_problem(data, origin)
    if old is not None:
        raise TestlistError([old])
    with gc_paused():
        cases, problems = _validated(data, origin, warn, owned)
    if problems:
        raise TestlistError(problems)
    return cases


def _validated(data: list[Any], origin: str, warn: Callable[[str], None],
               owned: bool = False) -> tuple[list[Case], list[str]]:
    """(the cases, every problem line) of a decoded testlist array (emptied as it goes when `owned`)."""
    cases: list[Case] = []
    problems: list[str] = []
    for index in range(len(data)):
        item = data[index]
        if owned:
            data[index] = None
        if not isinstance(item, dict):
            what = "null" if item is None else type(item).__name__
            problems.append(f"{origin}: case {index}: a case is a JSON object, got {what}")
            continue
        try:
            cases.append(Case.model_validate(_split_metadata(item, origin, index, warn)))
        except ValidationError as err:
            for e in err.errors():
                problems.append(f"{origin}: case {index}: {_loc(tuple(e['loc']))}: {_message(e)}")
        except RecursionError:
            problems.append(f"{origin}: case {index}: nested too deeply to read")
    return cases, problems


def validation_problem(err: ValidationError) -> str:
    """A validation error's first problem as a testlist problem reads: `args.m: ... at most ...`."""
    first = err.errors()[0]
    return f"{_loc(tuple(first['loc']))}: {_message(first)}"


def _message(error: Any) -> str:
    """A validation error's text, in the format page's words where pydantic's are only a bound."""
    if error["type"] == "less_than_equal" and (error.get("ctx") or {}).get("le") == MAX_INT64:
        return too_large(error["input"])
    return str(error["msg"]).removeprefix("Value error, ")


def read_json(path: str | os.PathLike[str]) -> Any:
    """A file's strict JSON (see strict_json); TestlistError naming the file when it is not."""
    path = Path(path)
    try:
        if path.exists() and not path.is_file():
            raise TestlistError([f"{path}: not a regular file; a testlist is a JSON file"])
        if path.exists() and path.stat().st_size > MAX_FILE_BYTES:
            raise TestlistError([f"{path}: {path.stat().st_size >> 20} MiB; a testlist is at most "
                                 f"{MAX_FILE_BYTES >> 20} MiB (split it)"])
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise TestlistError([f"{path}: cannot read: {err.strerror or err}"]) from err
    except UnicodeDecodeError as err:
        raise TestlistError([f"{path}: not UTF-8 text (byte {err.start}): a testlist is a JSON file"]) from err
    try:
        with gc_paused():
            return loads_strict(text, str(path))
    except StrictJSONError as err:
        raise TestlistError(err.problems) from err


def load_testlist(path: str | os.PathLike[str], on_warning: Optional[Callable[[str], None]] = None) -> list[Case]:
    """Read and validate a testlist file, every entry as written (duplicates too); TestlistError lists
    every problem (file, case, field). A run reads it with `read_testlist`, duplicates merged."""
    return _parse(read_json(path), str(path), on_warning, owned=True)


@dataclass(frozen=True)
class Testlist:
    """A testlist as a run holds it: each distinct case once, in first-seen order, with the index of
    its first copy in the file (the index rows and messages give it) and every copy's sources merged."""

    cases: list[Case]
    indexes: list[int]
    """The file index of each case's first copy, beside `cases`."""
    entries: int
    """The cases the file lists, duplicates counted."""

    @property
    def duplicates(self) -> int:
        """Entries that repeated an earlier case and were merged into it."""
        return self.entries - len(self.cases)

    def indexed(self) -> list[tuple[int, Case]]:
        """(index of the first copy in the file, case), in file order."""
        return list(zip(self.indexes, self.cases, strict=True))

    def merged_line(self) -> Optional[str]:
        """One line saying how many duplicates were merged, or None when there were none."""
        if not self.duplicates:
            return None
        what = "duplicate" if self.duplicates == 1 else "duplicates"
        return (f"{self.duplicates:,} {what} merged ({self.entries:,} entries; each copy's sources and recipes "
                "joined its first copy's)")


def read_testlist(path: str | os.PathLike[str], on_warning: Optional[Callable[[str], None]] = None) -> Testlist:
    """Read and validate a testlist file for a run: duplicates merged into their first copy."""
    with gc_paused():                             # one pause for reading, validating and merging
        cases = load_testlist(path, on_warning)
        merged, indexes = merge_indexed(cases)
    return Testlist(cases=merged, indexes=indexes, entries=len(cases))


def _merged_deployment(have: dict[str, Any], more: dict[str, Any]) -> Optional[dict[str, Any]]:
    """`metadata.deployment` of two copies of a per-rank case, each axis's sizes unioned and sorted
    (the catalog writes `{"tp": [8]}`: the TP deployments that run this per-rank shape); None when
    nothing is added."""
    a, b = have.get("deployment"), more.get("deployment")
    if not isinstance(a, dict) or not isinstance(b, dict) or a == b:
        return None
    out = dict(a)
    for axis, sizes in b.items():
        old = out.get(axis, [])
        if isinstance(old, list) and isinstance(sizes, list):
            out[axis] = sorted(set(old) | set(sizes), key=str)
    return out if out != a else None


class _Merging:
    """One distinct case while its copies are merged: sources and recipes as ordered sets (a dict),
    so each copy costs its own length, never the length of what was merged before it."""

    __slots__ = ("case", "sources", "recipes", "metadata", "changed")

    def __init__(self, case: Case) -> None:
        self.case = case
        self.sources: dict[str, None] = dict.fromkeys(case.sources)
        self.recipes: dict[str, None] = dict.fromkeys(case.recipes)
        self.metadata = case.metadata
        self.changed = False

    def add(self, copy: Case) -> None:
        for s in copy.sources:
            if s not in self.sources:
                self.sources[s] = None
                self.changed = True
        for r in copy.recipes:
            if r not in self.recipes:
                self.recipes[r] = None
                self.changed = True
        deployment = _merged_deployment(self.metadata, copy.metadata)
        if deployment is not None:
            self.metadata = {**self.metadata, "deployment": deployment}
            self.changed = True

    def merged(self) -> Case:
        if not self.changed:
            return self.case
        return self.case.model_copy(update={"sources": list(self.sources), "recipes": list(self.recipes),
                                            "metadata": self.metadata})


def merge_indexed(cases: Iterable[Case]) -> tuple[list[Case], list[int]]:
    """(distinct cases, the position of each one's first copy among `cases`): deduplicated by (type,
    args) in first-seen order, each carrying the union of its copies' sources, recipes and
    `metadata.deployment` sizes. Linear in the cases and their sources: a case's key is computed
    once, and each merged case is rebuilt once."""
    first: dict[str, int] = {}                   # key -> position in `out`
    out: list[Case] = []
    indexes: list[int] = []
    merging: dict[int, _Merging] = {}            # only the cases that have copies
    for index, case in enumerate(cases):
        key = case.key()
        at = first.get(key)
        if at is None:
            first[key] = len(out)
            out.append(case)
            indexes.append(index)
            continue
        have = merging.get(at)
        if have is None:
            have = merging[at] = _Merging(out[at])
        have.add(case)
    for at, have in merging.items():
        out[at] = have.merged()
    return out, indexes


def merge_cases(cases: Iterable[Case]) -> list[Case]:
    """Dedupe by (type, args), first-seen order; the survivors carry the union of sources, recipes
    and `metadata.deployment` sizes."""
    return merge_indexed(cases)[0]


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
    if path.exists():
        raise TestlistError([f"{name_or_path}: not a regular file; a testlist is a JSON file"])
    shipped = shipped_testlists()
    if name_or_path in shipped:
        return shipped[name_or_path]
    raise TestlistError([f"{name_or_path}: no such file, and no shipped testlist of that name "
                         f"(shipped: {', '.join(sorted(shipped)) or 'none'})"])
