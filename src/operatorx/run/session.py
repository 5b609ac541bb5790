"""A worker's whole session: every process a backend starts dies with its worker.

A backend may start processes of its own (a compile pool, a server, a helper that daemonizes). One
that double-forks under `setsid` leaves the worker's process group, so killing that group missed
it and it outlived the run. Two marks find such processes (Linux):

- the worker is a *child subreaper* (`prctl(PR_SET_CHILD_SUBREAPER)`): a descendant whose parent
  exits is re-parented to the worker, not to init, so while the worker lives every process it
  started, however often it forked, is in its process tree;
- every worker gets a token of its own in its environment (`OPERATORX_WORKER_SESSION`), which the
  processes it starts inherit: that finds them after the worker itself died (a crash, an exit),
  when they have gone to init.

`kill_session` stops the worker, kills its tree and every process holding its token until a scan
of /proc finds none, then kills the worker. What it cannot reach: a descendant that both cleared
its environment and lost the worker (the worker died first), and everything after a kill -9 of the
sweep's parent (the workers then die by their parent-death signal, with no one left to scan).
"""

from __future__ import annotations

import ctypes
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

__all__ = ["SESSION_ENV", "new_token", "become_subreaper", "session_processes", "kill_session",
           "kill_own_descendants", "KILL_SESSION_DEADLINE_S"]

SESSION_ENV = "OPERATORX_WORKER_SESSION"
"""The environment variable holding a worker's token; its descendants inherit it."""

KILL_SESSION_DEADLINE_S = 10.0
"""How long `kill_session` keeps scanning for processes that still live (one in uninterruptible
sleep, e.g. inside a driver call, dies only when that call returns)."""

_PR_SET_CHILD_SUBREAPER = 36
_PROC = Path("/proc")


def new_token() -> str:
    """A token no other worker has: 16 hex digits."""
    return secrets.token_hex(8)


def become_subreaper() -> bool:
    """Make this process (a worker) the child subreaper of everything it starts; False where the
    kernel has no such thing (not Linux, or older than 3.4)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


@dataclass(frozen=True)
class _Proc:
    pid: int
    ppid: int
    state: str
    """The kernel's one-letter state; `Z` is a zombie (dead, not yet reaped: nothing to kill)."""


def _stat(pid: int) -> Optional[_Proc]:
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'
    rest = text[text.rfind(")") + 2:].split()
    try:
        return _Proc(pid=pid, ppid=int(rest[1]), state=rest[0])
    except (IndexError, ValueError):
        return None


def _holds_token(pid: int, marker: bytes) -> bool:
    try:
        environ = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:                           # another user's process, or gone
        return False
    return marker in environ.split(b"\0")


def session_processes(token: str, root_pid: Optional[int] = None) -> set[int]:
    """The live (non-zombie) processes of a worker's session: those whose environment holds `token`,
    and the process tree of `root_pid` when that process holds the token itself (a pid that was
    reaped and reused by another program does not)."""
    marker = f"{SESSION_ENV}={token}".encode()
    procs: dict[int, _Proc] = {}
    try:
        entries = os.listdir(_PROC)
    except OSError:
        return set()
    for name in entries:
        if name.isdigit():
            p = _stat(int(name))
            if p is not None:
                procs[p.pid] = p
    found = {pid for pid, p in procs.items() if p.state != "Z" and _holds_token(pid, marker)}
    if root_pid is not None and root_pid in found:
        children: dict[int, list[int]] = {}
        for p in procs.values():
            children.setdefault(p.ppid, []).append(p.pid)
        todo = [root_pid]
        while todo:
            pid = todo.pop()
            for child in children.get(pid, []):
                if child not in found and procs[child].state != "Z":
                    found.add(child)
                todo.append(child)
    return found


def _signal(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_session(token: str, root_pid: Optional[int] = None, *, keep_root: bool = False,
                 deadline_s: float = KILL_SESSION_DEADLINE_S) -> int:
    """SIGKILL every process of the worker's session (see `session_processes`); the worker itself
    (`root_pid`) last, stopped first, so that while its descendants die it stays their subreaper
    and nothing they start can leave its tree. `keep_root`: the worker cleaning up after itself
    before it exits (its descendants only). This process is never signalled. Returns how many
    processes were."""
    if not token:
        return 0
    me = os.getpid()
    end = time.monotonic() + deadline_s
    signalled: set[int] = set()
    found = session_processes(token, root_pid)
    root = root_pid if root_pid is not None and root_pid in found else None
    if root is not None and not keep_root and root != me:
        _signal({root}, signal.SIGSTOP)
    while True:
        others = found - {root, me}
        if not others:
            break
        _signal(others, signal.SIGKILL)
        signalled |= others
        if time.monotonic() > end:
            break
        time.sleep(0.005)                     # SIGKILL is delivered asynchronously
        found = session_processes(token, root)
    if root is not None and not keep_root and root != me:
        _signal({root}, signal.SIGKILL)
        signalled.add(root)
    return len(signalled)


def kill_own_descendants() -> int:
    """In a worker about to exit: kill every process it started (its tree, it being their
    subreaper, and every holder of its token). A worker that ends by itself (stopped, or after a
    case that poisoned it) leaves nothing behind; once it has exited, its orphans belong to init
    and only the token finds them."""
    return kill_session(os.environ.get(SESSION_ENV, ""), os.getpid(), keep_root=True)
