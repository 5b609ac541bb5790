"""A worker's log: what it writes to its stdout and stderr, kept in the parent within a fixed size.

The worker's fds 1 and 2 are one pipe, read by a thread in the parent that keeps only the last
`LOG_KEPT_BYTES` and counts what it dropped. Why not a file: a backend writing to fd 1 in a loop
filled 300 MiB of disk in 2 s, and a capped file would need the writer's cooperation. A pipe also
holds back a writer that outruns the reader instead of losing what it wrote out of order. Why not
a reader inside the worker: a C extension that writes while holding the GIL would block on a full
pipe that only a Python thread of the same process could empty.
"""

from __future__ import annotations

import os
import threading

__all__ = ["WorkerLog", "LOG_KEPT_BYTES"]

LOG_KEPT_BYTES = 256 * 1024
"""The last bytes of a worker's output the parent keeps (what a crashed case's row quotes from)."""

_READ_BYTES = 64 * 1024


class WorkerLog:
    """The tail of one worker's output, read from `fd` (the pipe's read end, owned from now on) by a
    daemon thread until every writer has closed it."""

    def __init__(self, fd: int, name: str, kept_bytes: int = LOG_KEPT_BYTES) -> None:
        self.kept_bytes = kept_bytes
        self.written_bytes = 0
        """Everything the worker (and anything it started) wrote, kept or not."""
        self._buf = bytearray()
        self._lock = threading.Lock()
        self._fd = fd
        self._thread = threading.Thread(target=self._read, daemon=True, name=f"log-{name}")
        self._thread.start()

    @property
    def dropped_bytes(self) -> int:
        """What was written and is no longer kept (the oldest output first)."""
        with self._lock:
            return self.written_bytes - len(self._buf)

    def _read(self) -> None:
        try:
            while True:
                try:
                    chunk = os.read(self._fd, _READ_BYTES)
                except InterruptedError:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                with self._lock:
                    self.written_bytes += len(chunk)
                    self._buf += chunk
                    over = len(self._buf) - self.kept_bytes
                    if over > 0:
                        del self._buf[:over]
        finally:
            os.close(self._fd)

    def drain(self, timeout_s: float = 2.0) -> None:
        """Wait (at most `timeout_s`) until the output is read to its end: after the worker died, so
        that its last lines (a traceback) are in the tail. A process it started that still holds the
        pipe open keeps it from ending; the wait then ends at `timeout_s`."""
        self._thread.join(timeout_s)

    def tail(self, nbytes: int) -> str:
        """The last `nbytes` of the output as text (undecodable bytes replaced), stripped; when the
        cap dropped older output, a first line says how much."""
        with self._lock:
            data = bytes(self._buf[-nbytes:]) if nbytes > 0 else b""
            dropped = self.written_bytes - len(self._buf)
        text = data.decode("utf-8", "replace").strip()
        if dropped > 0:
            note = (f"[worker output capped: {dropped:,} earlier bytes of {self.written_bytes:,} dropped; "
                    f"the parent keeps the last {self.kept_bytes:,}]")
            return f"{note}\n{text}" if text else note
        return text
