"""A GPU wait that the host ends: the head start of a batch, as long as the host really needs.

A batch queues its n [flush, call] iterations behind a wait on the GPU, so that the calls then
run back to back from a full queue and no call waits on its own launch (measure/trace.py). A
fixed spin (`torch.cuda._sleep`) has to guess how long the host takes to enqueue them: 1.2 times
the warmup's enqueue time, and never trimmed for a multi-kernel call, so a multi-kernel call's
spins hold the GPU far longer than the host takes to enqueue.

This wait is a one-thread kernel that polls a word of pinned host memory until the host writes
the batch's ticket there, right after its last launch; then the GPU starts on the queue at
once. It gives up after `max_cycles` SM cycles, the length the fixed spin would have had: a
host blocked inside a launch (a full launch queue) can never write the ticket, and the batch
then goes on exactly as behind a fixed spin (its starved calls dropped and counted).

Where the kernel cannot run (no Triton, or pinned memory the GPU cannot map), `host_release()`
returns None with the reason in `unavailable_reason()`, and batches keep the fixed spin.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["HostRelease", "host_release", "unavailable_reason"]

_MAX_CYCLES = 2**31 - 1     # ~1 s at 2 GHz; the timer's spins stop at 0.25 s
_instance: Optional[HostRelease] = None
_unavailable: Optional[str] = None
_kernel: Any = None


def _wait_kernel() -> Any:
    """The Triton kernel: poll `flag` (volatile: every read goes to host memory) until it reaches
    `ticket`, or `max_cycles` of the SM clock have passed."""
    global _kernel
    if _kernel is None:
        import triton
        import triton.language as tl

        # not specialized on the ints' values: Triton would compile again for a ticket of 1 or a budget
        # divisible by 16 (a compile of hundreds of ms, inside the first case that hit one)
        @triton.jit(do_not_specialize=["ticket", "max_cycles"])
        def _ox_wait_for_host(flag, ticket, max_cycles):
            start = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False,
                                              pack=1)
            now = start
            seen = tl.load(flag, volatile=True)
            while (seen < ticket) & (now - start < max_cycles):
                seen = tl.load(flag, volatile=True)
                now = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False,
                                                pack=1)

        _kernel = _ox_wait_for_host
    return _kernel


class HostRelease:
    """One pinned ticket word per process, and the wait kernel that reads it."""

    def __init__(self) -> None:
        import torch

        self._flag = torch.zeros(1, dtype=torch.int64, pin_memory=True)
        self._word = self._flag.numpy()         # the host's write: one 8-byte store, no torch dispatch
        self._ticket = 0
        self._held = False
        self.hold(1)            # compiles the kernel and maps the word: a refusal raises here, before launch
        self.release()

    def hold(self, max_cycles: int) -> None:
        """Queue the wait on the current stream; the GPU waits until `release()` or `max_cycles`. A
        hold left over (an error between a hold and its release) is released first: its wait has
        ended by its budget anyway, and refusing would fail every later batch of the process."""
        self.release()
        self._ticket += 1
        budget = min(max(1, int(max_cycles)), _MAX_CYCLES)     # an int32 always: one compiled signature
        self._held = True       # before the launch: one that queued the wait and then raised is still let go
        _wait_kernel()[(1,)](self._flag, self._ticket, budget, num_warps=1)

    def release(self) -> None:
        """Let the GPU go on with what was queued behind the wait (at once if it gave up already)."""
        if self._held:
            self._word[0] = self._ticket
            self._held = False


def host_release() -> Optional[HostRelease]:
    """The process's wait, built on first use; None where it cannot run (`unavailable_reason()`)."""
    global _instance, _unavailable
    if _instance is None and _unavailable is None:
        import torch

        if getattr(torch.version, "hip", None):
            _unavailable = "ROCm: the wait reads NVIDIA's %clock64 (PTX)"
            return None
        if torch.cuda.is_available():
            torch.cuda.synchronize()    # an earlier op's asynchronous error is its own, not this wait's
        try:
            built = HostRelease()
        except Exception as err:  # noqa: BLE001 - no Triton, no pinned memory, a pointer refused: the fixed spin
            _unavailable = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200] if str(err).strip() else ''}"
            return None
        torch.cuda.synchronize()        # outside the fallback: a wait that faulted on the GPU is a real error
        _instance = built
    return _instance


def unavailable_reason() -> Optional[str]:
    """Why batches use the fixed spin instead (None: the wait works, or was never asked for)."""
    return _unavailable
