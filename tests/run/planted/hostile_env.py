"""A `py:` backend for the sweep's process and memory tests, chosen by the case's m:

    m=10 raises MemoryError                     m=11 allocates past an RLIMIT_AS it sets in its worker
    m=12 double-forks a sleeping grandchild (setsid, environment kept), then its worker exits
    m=13 double-forks a sleeping grandchild with an empty environment, then times the GEMM
    m=14 raises when a grandchild recorded by an m=12 case still lives (checked on a fresh worker)
    m=15 writes `flood_mib` MiB to fd 1, a last line, then its worker exits
    m=16 holds `hold_mib` MiB resident, writes its resident bytes to `marker`.rss, waits for `marker`
         (the test makes it once the parent has sampled that much), then SIGKILLs its worker
    anything else: an honest float GEMM

Grandchildren's pids are appended to `pid_dir`/m<M>.pids.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from operatorx.backends.py_file import gemm_inputs

_MIB = 1024 * 1024
_KEPT: list[Any] = []


def _alive(pid: int) -> bool:
    """Running, sleeping or stopped; a zombie (dead, not yet reaped) or a missing pid is not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


def _plant_grandchild(pid_file: Path, clear_env: bool) -> int:
    """fork → setsid → fork → exec sleep; the middle process exits at once, so the grandchild is an
    orphan in a session of its own (what a daemonizing helper does). Returns its pid."""
    sleep = shutil.which("sleep") or "/bin/sleep"
    env: dict[str, str] = {} if clear_env else dict(os.environ)
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                os.close(r)
                os.write(w, str(os.getpid()).encode())
                os.close(w)
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.execve(sleep, [sleep, "1000"], env)
        finally:
            os._exit(0)
    os.close(w)
    pid = int(os.read(r, 32) or b"0")
    os.close(r)
    os.waitpid(middle, 0)
    with open(pid_file, "a") as f:
        f.write(f"{pid}\n")
    return pid


def _vm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")


def build(case: Any, device: str, pid_dir: str = "", flood_mib: int = 64, hold_mib: int = 200,
          marker: str = "") -> Any:
    m = case.args.m
    inputs = gemm_inputs(case, device)
    a, b = inputs["a"], inputs["b"]
    pids = Path(pid_dir) if pid_dir else Path(".")
    if m == 13:
        _plant_grandchild(pids / "m13.pids", clear_env=True)

    def call() -> Any:
        if m == 10:
            raise MemoryError()
        if m == 11:
            import torch

            limit = _vm_bytes() + 256 * _MIB
            resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
            torch.empty(4 * 1024 * _MIB, dtype=torch.uint8).fill_(1)
        if m == 12:
            _plant_grandchild(pids / "m12.pids", clear_env=False)
            os._exit(1)
        if m == 14:
            recorded = (pids / "m12.pids").read_text().split() if (pids / "m12.pids").exists() else []
            living = [p for p in recorded if _alive(int(p))]
            if not recorded or living:
                raise RuntimeError(f"grandchildren recorded {recorded}, alive {living}")
        if m == 15:
            chunk = b"x" * (_MIB - 1) + b"\n"
            for _ in range(flood_mib):
                os.write(1, chunk)
            os.write(1, b"the last line before the exit\n")
            os._exit(1)
        if m == 16:
            Path(marker).unlink(missing_ok=True)
            _KEPT.append(bytearray(os.urandom(1024)) * (hold_mib * 1024))    # resident: every page written
            rss = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            Path(f"{marker}.rss").write_text(str(rss))
            t0 = time.monotonic()
            while not os.path.exists(marker) and time.monotonic() - t0 < 300:
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)
        return a @ b.t()

    return call
