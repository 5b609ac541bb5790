"""What each released case leaves allocated on the GPU (issue 14 item 4), for the backends' gpu tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from operatorx.spec import Case

__all__ = ["memory_left_after_release"]


def memory_left_after_release(cases: Sequence[Case], run_and_release: Callable[[Case], None]) -> dict[str, int]:
    """Bytes `torch.cuda.memory_allocated` shows after each case's release, relative to before its
    prepare, with no garbage collection in between (printed in MiB, for the device log)."""
    import torch

    left: dict[str, int] = {}
    for i, case in enumerate(cases):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        run_and_release(case)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        left[f"{i} {case.label()} {case.scheme()}"] = torch.cuda.memory_allocated() - before
    print({k: round(v / 2**20, 2) for k, v in left.items()})
    return left
