"""Compiled bytecode kept between runs, for environments that ship none and forbid writing it.

Why: some images set `PYTHONDONTWRITEBYTECODE=1` and ship torch without `.pyc` files. Every
interpreter then compiles about a thousand modules before it can time anything: seconds of a sweep
worker's start, paid again by every
worker that replaces a crashed one, and a fixed cost that keeps a short sweep on N GPUs from running
N times faster. Python can keep that bytecode in a separate tree (`PYTHONPYCACHEPREFIX`) and leave
the installed packages untouched, which is what such images usually want from the variable.

The cache is used only when all of these hold, so an environment that works as intended is left
alone:
- bytecode writing is off (`PYTHONDONTWRITEBYTECODE` set, or `sys.dont_write_bytecode` in process);
- no prefix is set already (`PYTHONPYCACHEPREFIX` / `sys.pycache_prefix`);
- the probe package (torch) has no shipped bytecode next to its sources: with a prefix set Python
  reads bytecode only from the prefix, so an image that ships `.pyc` files would compile everything
  once more instead of reading them;
- `OPERATORX_BYTECODE_CACHE` is not `0`, `false`, `no` or `off`;
- the tree can be made and written: with a prefix set, Python reads no bytecode outside it (the
  standard library's shipped `.pyc` included), so a tree it cannot write would make every process
  compile more than before. No home directory (a container under an arbitrary user) counts as no tree.

The tree lives in `$OPERATORX_BYTECODE_CACHE_DIR`, else `<cache root>/pycache`. Writes are atomic
(importlib writes a temporary file and renames it), so workers that start together can share it.
Python runs the bytecode it finds there: a directory that others can write is not a safe choice.

This module imports only the standard library, and sits outside `operatorx.platform` (whose package
imports pydantic): what the command imports before the cache is on is compiled from source each time.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

from operatorx.user_cache import cache_root

__all__ = ["ENV_SWITCH", "ENV_DIR", "bytecode_cache_dir", "wanted", "worker_env", "enable_in_process"]

ENV_SWITCH = "OPERATORX_BYTECODE_CACHE"
ENV_DIR = "OPERATORX_BYTECODE_CACHE_DIR"
_PROBE_PACKAGE = "torch"


_OFF = ("0", "false", "no", "off")


def bytecode_cache_dir(env: Mapping[str, str]) -> Path:
    """`$OPERATORX_BYTECODE_CACHE_DIR`, else the user cache root's `pycache`. Raises RuntimeError
    where there is no home directory to put it in (`Path.home()`)."""
    return Path(env[ENV_DIR]) if env.get(ENV_DIR) else cache_root(env) / "pycache"


def _writable_tree(env: Mapping[str, str]) -> Optional[Path]:
    """The tree, made if need be, when this process can write it; else None."""
    try:
        tree = bytecode_cache_dir(env)
        tree.mkdir(parents=True, exist_ok=True)
    except (RuntimeError, OSError):           # no home directory; a read-only or foreign location
        return None
    return tree if os.access(tree, os.W_OK | os.X_OK) else None


def _ships_bytecode(package: str) -> bool:
    """Whether `package` has compiled bytecode next to its sources (found without importing it; a
    package that is not installed counts as shipping none)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    source = Path(spec.origin)
    tag = sys.implementation.cache_tag
    return tag is not None and (source.parent / "__pycache__" / f"{source.stem}.{tag}.pyc").is_file()


def wanted(env: Mapping[str, str], writes_off: bool, prefix_set: bool,
           probe_package: str = _PROBE_PACKAGE) -> Optional[Path]:
    """The tree a process with this environment should keep its bytecode in, or None to leave it be."""
    if env.get(ENV_SWITCH, "1").strip().lower() in _OFF or not writes_off or prefix_set:
        return None
    if _ships_bytecode(probe_package):
        return None
    return _writable_tree(env)


def worker_env(env: dict[str, str], probe_package: str = _PROBE_PACKAGE) -> dict[str, str]:
    """The environment for a process we spawn (a sweep worker): bytecode writes on, into the cache
    tree, when `wanted`; else `env` unchanged."""
    tree = wanted(env, writes_off=bool(env.get("PYTHONDONTWRITEBYTECODE")),
                  prefix_set=bool(env.get("PYTHONPYCACHEPREFIX")), probe_package=probe_package)
    if tree is None:
        return env
    out = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out["PYTHONPYCACHEPREFIX"] = str(tree)
    return out


def enable_in_process(probe_package: str = _PROBE_PACKAGE) -> Optional[Path]:
    """The same for the running interpreter (the CLI's parent process, before its heavy imports):
    modules imported from now on read and write the cache tree. Returns the tree, or None when the
    environment is left as it was."""
    tree = wanted(os.environ, writes_off=sys.dont_write_bytecode, prefix_set=sys.pycache_prefix is not None,
                  probe_package=probe_package)
    if tree is None:
        return None
    sys.pycache_prefix = str(tree)
    sys.dont_write_bytecode = False
    return tree
