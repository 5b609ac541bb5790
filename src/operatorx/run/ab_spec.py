"""What an A/B side is: a backend, a backend with settings, or user code from a file or a directory.

    torch                                 a built-in backend
    torch[allow_tf32=false,blas=cublaslt] the same with torch settings, applied around its
                                          prepare, its check and each of its batches (never inside
                                          the timed calls of the other side)
    py:PATH.py:FUNC[k=v]                  user code; settings are FUNC's keyword arguments
    mod:PKG.MOD:FUNC@DIR[k=v]             user code imported from DIR (two checkouts, one process)

Settings of built-in backends come from a table of torch's global switches; an unknown key is
refused with the list, never ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from operatorx.backends import Backend, get_backend
from operatorx.backends.py_file import is_user_spec, load_user_function, parse_settings

__all__ = ["Side", "parse_side", "TORCH_SWITCHES"]


def _matmul() -> Any:
    import torch

    return torch.backends.cuda.matmul


def _default_device_get() -> Any:
    import torch

    ctx = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
    return None if ctx is None else str(ctx.device)


def _set_default_device(value: Any) -> None:
    import torch

    torch.set_default_device(None if value in (None, "none", "") else value)


def _blas_get() -> Any:
    import torch

    return str(getattr(torch.backends.cuda.preferred_blas_library(), "name", "")).lower()


def _blas_set(value: Any) -> None:
    import torch

    torch.backends.cuda.preferred_blas_library(str(value))


def _threads_set(value: Any) -> None:
    import torch

    torch.set_num_threads(int(value))


def _threads_get() -> Any:
    import torch

    return torch.get_num_threads()


#: name → (read the current value, set a value). Each is restored after every use.
TORCH_SWITCHES: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
    "allow_tf32": (lambda: _matmul().allow_tf32, lambda v: setattr(_matmul(), "allow_tf32", bool(v))),
    "allow_bf16_reduced_precision_reduction": (
        lambda: _matmul().allow_bf16_reduced_precision_reduction,
        lambda v: setattr(_matmul(), "allow_bf16_reduced_precision_reduction", bool(v))),
    "allow_fp16_reduced_precision_reduction": (
        lambda: _matmul().allow_fp16_reduced_precision_reduction,
        lambda v: setattr(_matmul(), "allow_fp16_reduced_precision_reduction", bool(v))),
    "blas": (_blas_get, _blas_set),
    "default_device": (_default_device_get, _set_default_device),
    "num_threads": (_threads_get, _threads_set),
}


@contextmanager
def _switched(settings: dict[str, Any]) -> Iterator[None]:
    before = {k: TORCH_SWITCHES[k][0]() for k in settings}
    try:
        for k, v in settings.items():
            TORCH_SWITCHES[k][1](v)
        yield
    finally:
        for k, v in before.items():
            TORCH_SWITCHES[k][1](v)


@dataclass(frozen=True)
class Side:
    """One side of an A/B: how to get its backend for an op type, and its settings context."""

    spec: str
    base: str
    settings: dict[str, Any] = field(default_factory=dict)
    user_code: bool = False

    def backend(self, op_type: str) -> Backend | None:
        return get_backend(self.spec if self.user_code else self.base, op_type)

    def context(self) -> AbstractContextManager[Any]:
        """Entered around this side's prepare, check and batches (user settings go to FUNC instead)."""
        if self.user_code or not self.settings:
            return nullcontext()
        return _switched(self.settings)


def parse_side(spec: str) -> Side:
    """A Side from its text; ValueError for user code that does not load or an unknown setting."""
    spec = spec.strip()
    if is_user_spec(spec):
        _, settings, _ = load_user_function(spec)      # load now: a bad file fails before any case
        return Side(spec=spec, base=parse_settings(spec)[0], settings=settings, user_code=True)
    base, settings = parse_settings(spec)
    unknown = sorted(set(settings) - set(TORCH_SWITCHES))
    if unknown:
        raise ValueError(f"{spec}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(TORCH_SWITCHES)}")
    from operatorx.backends import backend_names

    if base not in backend_names():
        raise ValueError(f"{spec}: no backend {base!r} (built-in: {', '.join(backend_names())}; or py:/mod:)")
    return Side(spec=spec, base=base, settings=settings)
