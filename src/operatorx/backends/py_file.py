"""Bring your own implementation: a function in the user's file, timed like any built-in backend.

    --backend py:PATH.py:FUNC            a file, loaded by path
    --backend mod:PKG.MOD:FUNC@DIR       a module imported from the source directory DIR, so the
                                         same package from two checkouts can be A/B'd in one process
    either one may end in [key=value,...]: keyword arguments for FUNC (numbers, true/false, text)

`FUNC(case, device, **kwargs)` (docs/user-backends.md) prepares its inputs and returns a
zero-argument callable that runs the op (the timed call), or a full `Prepared` (with its own
check and layers), or raises `operatorx.backends.Unsupported`. Everything else (timing,
telemetry, store) is the built-in path.

The check is honest about what it knows. A function that builds its inputs with `gemm_inputs`
(the torch backend's seeded inputs for a float GEMM) is checked against an fp32 matmul of those
very tensors. Otherwise nothing is compared, and the row says `checked: false`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Optional

from operatorx.backends.base import Check, Prepared, Unsupported
from operatorx.backends.check import CHECK_ROWS, REL_ERROR_BOUND, rel_error
from operatorx.backends.names import is_user_spec
from operatorx.spec import Case, GemmArgs

__all__ = ["UserBackend", "user_backend", "load_user_function", "parse_settings", "gemm_inputs", "is_user_spec",
           "warm"]

_LOADED: dict[tuple[str, str], Any] = {}
_HANDED_OUT: ContextVar[Optional[list[dict[str, Any]]]] = ContextVar("operatorx_user_inputs", default=None)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_settings(spec: str) -> tuple[str, dict[str, Any]]:
    """`base[k=v,k2=v2]` → (base, {k: v}); values read as JSON where they parse (1, 2.5, true)."""
    if not spec.endswith("]") or "[" not in spec:
        return spec, {}
    base, _, inner = spec[:-1].rpartition("[")
    settings: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in inner.split(","))):
        key, eq, val = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"{spec}: setting {item!r} is not key=value")
        settings[key.strip()] = _value(val.strip())
    return base, settings


def _load_file(path_text: str) -> Any:
    path = Path(path_text).expanduser().resolve()
    key = ("py", str(path))
    if key not in _LOADED:
        if not path.is_file():
            raise ValueError(f"py: backend file {path} does not exist")
        mod_name = "operatorx_user_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(mod_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module          # dataclasses and pickling look modules up by name
        try:
            spec.loader.exec_module(module)
        except Exception as err:
            del sys.modules[mod_name]
            raise ValueError(f"py: loading {path} failed: {type(err).__name__}: {err}") from err
        _LOADED[key] = module
    return _LOADED[key]


def _owned(top: str, name: str) -> bool:
    return name == top or name.startswith(top + ".")


def _load_module(dotted: str, directory: str) -> Any:
    """Import `dotted` from `directory` alone, leaving sys.modules as it was.

    The package's modules are taken out of sys.modules for the import and put back after, so a
    second directory can load its own copy. A module the code imports lazily at call time is
    resolved against whatever sys.modules holds then: keep imports at module level.
    """
    root = Path(directory).expanduser().resolve()
    key = (str(root), dotted)
    if key in _LOADED:
        return _LOADED[key]
    if not root.is_dir():
        raise ValueError(f"mod: source directory {root} does not exist")
    top = dotted.split(".")[0]
    saved = {k: v for k, v in sys.modules.items() if _owned(top, k)}
    for k in saved:
        del sys.modules[k]
    sys.path.insert(0, str(root))
    try:
        importlib.invalidate_caches()
        module = importlib.import_module(dotted)
    except Exception as err:
        raise ValueError(f"mod: importing {dotted} from {root} failed: {type(err).__name__}: {err}") from err
    finally:
        sys.path.remove(str(root))
        for k in [k for k in sys.modules if _owned(top, k)]:
            del sys.modules[k]
        sys.modules.update(saved)
    origin = Path(getattr(module, "__file__", "") or "").resolve()
    if root not in origin.parents:
        raise ValueError(f"mod:{dotted}@{root}: imported {origin} instead (not under that directory)")
    _LOADED[key] = module
    return module


def load_user_function(name: str) -> tuple[Callable[..., Any], dict[str, Any], str]:
    """(FUNC, its keyword settings, where it came from) for a `py:` or `mod:` spec; ValueError if bad."""
    base, settings = parse_settings(name)
    if base.startswith("py:"):
        path, sep, func = base[3:].rpartition(":")
        if not sep or not path or not func:
            raise ValueError(f"{name}: expected py:PATH.py:FUNC")
        module, origin = _load_file(path), str(Path(path).expanduser().resolve())
    elif base.startswith("mod:"):
        target, at, directory = base[4:].rpartition("@")
        dotted, sep, func = target.rpartition(":")
        if not at or not sep or not dotted or not func or not directory:
            raise ValueError(f"{name}: expected mod:PKG.MOD:FUNC@DIR")
        module = _load_module(dotted, directory)
        origin = f"{dotted} from {Path(directory).expanduser().resolve()}"
    else:
        raise ValueError(f"{name}: not a py: or mod: backend")
    fn = getattr(module, func, None)
    if not callable(fn):
        raise ValueError(f"{name}: {origin} has no function {func!r}")
    _check_signature(fn, func, settings, name)
    return fn, settings, f"{origin}:{func}"


def _check_signature(fn: Callable[..., Any], func: str, settings: dict[str, Any], name: str) -> None:
    """Refuse, before any case runs, a function that cannot be called as FUNC(case, device, **settings)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):      # a builtin without a signature: let the first call tell
        return
    try:
        sig.bind(None, None, **settings)
    except TypeError as err:
        raise ValueError(f"{name}: {func}{sig} cannot be called as {func}(case, device"
                         f"{''.join(f', {k}=...' for k in settings)}) ({err}); write "
                         f"def {func}(case, device{''.join(f', {k}' for k in settings)}) and read the shape "
                         "from case.args (docs/user-backends.md)") from None


def gemm_inputs(case: Case, device: str) -> dict[str, Any]:
    """The torch backend's inputs for a float GEMM case: {"a" [M,K], "b" [N,K], "bias" [N] or None}.

    Same seed, same tensors as `--backend torch`, so outputs can be compared; a `py:` function
    that builds its inputs here is checked against an fp32 matmul of them.
    """
    import torch

    from operatorx.backends.torch.gemm import float_inputs
    from operatorx.spec.dtypes import FLOAT_DTYPES

    args = case.args
    if not isinstance(args, GemmArgs) or args.a.dtype not in FLOAT_DTYPES or args.a.dtype != args.b.dtype:
        raise Unsupported("gemm_inputs gives float GEMM inputs (one dtype for a and b) only")
    inputs = float_inputs(args, device, torch.Generator(device=device).manual_seed(case.seed()))
    handed = _HANDED_OUT.get()
    if handed is not None:
        handed.append(inputs)
    return inputs


def _gemm_check(fn: Callable[[], Any], inputs: dict[str, Any], args: GemmArgs) -> Callable[[], Check]:

    def check() -> Check:
        import torch

        rows = min(args.m, CHECK_ROWS)
        out = fn()
        why = "fp32 matmul of the inputs gemm_inputs gave"
        if not isinstance(out, torch.Tensor) or list(out.shape) != [args.m, args.n]:
            shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            return Check(float("nan"), REL_ERROR_BOUND.get(args.out, 1e-2), 0, f"{why}; output is {shape}, "
                         f"expected [{args.m}, {args.n}]")
        ref = inputs["a"][:rows].float() @ inputs["b"].float().T
        if inputs["bias"] is not None:
            ref += inputs["bias"].float()
        return Check(rel_error(out[:rows], ref), REL_ERROR_BOUND.get(args.out, 1e-2), rows, why)

    return check


def _needs_args(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):   # a builtin without a signature: let the first call tell
        return False
    return any(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


class UserBackend:
    """A `py:`/`mod:` spec as a Backend: the user's function decides what it supports."""

    def __init__(self, name: str, op_type: str):
        self.name = name
        self.op_type = op_type
        self.func, self.settings, self.origin = load_user_function(name)

    def supports(self, case: Case, device: str) -> Optional[str]:
        return None   # the function refuses by raising Unsupported in prepare

    def prepare(self, case: Case, device: str) -> Prepared:
        handed: list[dict[str, Any]] = []
        token = _HANDED_OUT.set(handed)
        try:
            result = self.func(case, device, **self.settings)
        finally:
            _HANDED_OUT.reset(token)
        meta = {"call": self.origin, "user_code": True, "settings": dict(self.settings)}
        if isinstance(result, Prepared):
            result.metadata = {**meta, **result.metadata}
            return result
        if not callable(result):
            raise TypeError(f"{self.origin} returned {type(result).__name__}, not a zero-argument callable "
                            "or a Prepared")
        if _needs_args(result):
            raise TypeError(f"{self.origin} returned a callable that needs arguments; return one that takes none")
        if handed and isinstance(case.args, GemmArgs):
            check = _gemm_check(result, handed[-1], case.args)
        else:
            check = lambda: Check.not_checked(  # noqa: E731
                "none: the function gave no reference and did not build its inputs with gemm_inputs; "
                "the output was not checked")
        return Prepared(fn=result, check=check, metadata=meta)


def user_backend(name: str, op_type: str) -> UserBackend:
    return UserBackend(name, op_type)


def warm(backend_name: str, device_kind: str) -> None:
    """Import the user's module before the first case (its import time is the worker's)."""
    load_user_function(backend_name)
