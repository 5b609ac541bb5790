"""The L2 state each timed call starts in, declared per row and produced on purpose.

Three states (`L2_STATES`):
- `cold_clean` (default): nothing of the op's data is in L2 and no line is dirty. A plain
  "flush" that zeroes a big buffer leaves L2 full of dirty lines, and the op then pays to
  write them back (a read after a dirty flush is slower than after a clean one). So we zero a
  buffer of twice the L2 (every line of
  the op's data is evicted) and then run `discard.global.L2` over that buffer: its lines are
  dropped without a write-back, and L2 is left empty and clean.
- `cold_dirty`: the zeroing alone (what most harnesses call "flush L2").
- `warm`: no flush; the previous call's data stays in L2, as in back-to-back layers that
  reuse a weight.

Reading a buffer (`torch.sum`) instead of zeroing it does not evict: the op's weights stay in
L2 (they are re-referenced), so it is not offered.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

__all__ = ["L2_STATES", "L2State", "L2Flusher", "discard_l2"]

L2State = Literal["cold_clean", "cold_dirty", "warm"]
L2_STATES: tuple[L2State, ...] = ("cold_clean", "cold_dirty", "warm")

_LINE_BYTES = 128                  # discard.global.L2 drops one 128-byte line per instruction
_BLOCK_LINES = 1024

_discard_kernel: Any = None


def _kernel() -> Any:
    """The Triton kernel that discards one L2 line per element (PTX ISA 7.4+, sm_80+)."""
    global _discard_kernel
    if _discard_kernel is None:
        import triton
        import triton.language as tl

        @triton.jit
        def _ox_l2_discard(base, n_lines, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            addr = base + tl.minimum(offs, n_lines - 1).to(tl.int64) * 128
            tl.inline_asm_elementwise("discard.global.L2 [$1], 128; mov.u32 $0, 0;", "=r,l", [addr],
                                      dtype=tl.int32, is_pure=False, pack=1)

        _discard_kernel = _ox_l2_discard
    return _discard_kernel


def discard_l2(buffer: Any) -> None:
    """Drop `buffer`'s lines from L2 without writing them back. Its contents become undefined."""
    import triton

    if buffer.data_ptr() % _LINE_BYTES or buffer.nbytes % _LINE_BYTES:
        raise ValueError("discard_l2 needs a 128-byte aligned buffer of whole lines")
    n_lines = buffer.nbytes // _LINE_BYTES
    _kernel()[(triton.cdiv(n_lines, _BLOCK_LINES),)](buffer.data_ptr(), n_lines, BLOCK=_BLOCK_LINES)


class L2Flusher:
    """Puts L2 into the declared state before each timed call (`flush()`); does nothing when warm."""

    def __init__(self, state: L2State, l2_bytes: Optional[int], flush_bytes: Optional[int] = None):
        if state not in L2_STATES:
            raise ValueError(f"l2 state must be one of {', '.join(L2_STATES)}, got {state!r}")
        self.state = state
        self.flush_bytes = 0
        self._buffer: Any = None
        self._graph: Any = None
        if state == "warm":
            return
        if not (flush_bytes or l2_bytes):
            raise ValueError(f"l2 state {state!r} needs the device's L2 size (unknown here); pass flush_bytes")
        nbytes = flush_bytes or 2 * int(l2_bytes)  # type: ignore[arg-type]
        self.flush_bytes = -(-nbytes // _LINE_BYTES) * _LINE_BYTES
        import torch

        self._buffer = torch.empty(self.flush_bytes, dtype=torch.uint8, device="cuda")
        if state == "cold_clean":
            try:
                self._eager_flush()          # compile the discard kernel now, not inside a timed batch
            except Exception as err:         # noqa: BLE001 - no silent fallback to a dirty flush
                raise RuntimeError(f"l2 state cold_clean needs Triton's discard.global.L2 kernel, which failed "
                                   f"here ({type(err).__name__}: {err}); use --l2 cold_dirty and say so") from err
        self._graph = self._capture()

    def _eager_flush(self) -> None:
        self._buffer.zero_()
        if self.state == "cold_clean":
            discard_l2(self._buffer)

    def _capture(self) -> Any:
        """The flush as a CUDA graph: the same kernels, but one cheap launch instead of Triton's Python
        launcher each time (the host must enqueue flush + call faster than the GPU runs them).
        None where capture is refused; the eager flush is then used, with the same effect."""
        import torch

        try:
            from operatorx.measure.side_stream import side_stream

            stream = side_stream()
            stream.wait_stream(torch.cuda.current_stream())
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(stream):
                self._eager_flush()
                with torch.cuda.graph(graph, stream=stream):
                    self._eager_flush()
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            return graph
        except Exception:  # noqa: BLE001 - an eager flush does the same work, only slower to enqueue
            torch.cuda.synchronize()
            return None

    def flush(self) -> None:
        if self._buffer is None:
            return
        if self._graph is not None:
            self._graph.replay()
        else:
            self._eager_flush()

    def release(self) -> None:
        self._graph = None
        self._buffer = None

    @property
    def launch(self) -> Literal["cuda_graph", "eager"]:
        """How the flush is launched: one CUDA graph replay, or its kernels one by one."""
        return "cuda_graph" if self._graph is not None else "eager"

    def to_json(self) -> dict[str, Any]:
        return {"l2_state": self.state, "flush_bytes": self.flush_bytes, "flush_launch": self.launch}
