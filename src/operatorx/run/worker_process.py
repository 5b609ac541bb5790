"""The parent's handle on one worker process: start it, hand it a case, wait for the row with a
deadline, and kill its whole session (its process group and whatever it started, run/session.py)
when the case hangs or the process dies. Its stdout and stderr come to the parent through a pipe,
kept within a cap (run/worker_log.py).

`Slot` is what the scheduler talks to: it keeps one worker alive (starting a fresh one when the
last was killed or retired itself) and turns whatever happened to a case into a `CaseOutcome`.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from operatorx.run.compiling import compilers_running, reaped_children_cpu_s
from operatorx.run.config import WORKER_START_TIMEOUT_S
from operatorx.run.faults import died_of_allocation, hung_at
from operatorx.run.job import JobSpec
from operatorx.run.oom import MemoryCgroup, memory_cgroup, oom_kill_evidence, rss_bytes_of
from operatorx.run.protocol import STACKS_SIGNAL, WorkerMessage, parse, send
from operatorx.run.session import SESSION_ENV, kill_session, new_token
from operatorx.run.worker_log import WorkerLog

if TYPE_CHECKING:
    from operatorx.spec import Case

__all__ = ["CaseOutcome", "WorkerProcess", "Slot", "WorkerStartError", "STDERR_TAIL_BYTES", "TIMEOUT_TAIL_BYTES",
           "AHEAD_MAX_BYTES"]

STDERR_TAIL_BYTES = 2000
#: A timed-out case's detail keeps more of the log: the Python stacks the worker wrote when asked.
TIMEOUT_TAIL_BYTES = 6000
#: How long a hung worker gets to write its stacks (STACKS_SIGNAL) before the kill.
STACKS_WAIT_S = 2.0
#: While a compiler of a worker's session runs at its case's deadline, the deadline moves on by this much
#: and is checked again (within --compile-grace).
COMPILE_STEP_S = 2.0

AHEAD_MAX_BYTES = 16 * 1024
"""The longest case line sent ahead. It waits in the worker's stdin pipe (64 KiB on Linux) while the
worker runs another case; a line the pipe cannot take would block the parent's write, and with it
the running case's deadline. A longer case is sent when its worker is idle and reading."""


class WorkerStartError(RuntimeError):
    """A worker could not start (its reason, and the tail of its log)."""


@dataclass
class CaseOutcome:
    """What became of one case in one worker: its row (as JSON) or why there is none."""

    index: int
    row: Optional[dict[str, Any]] = None
    failure: Optional[str] = None
    """None when the worker answered; else `timeout`, `crashed`, `oom` (killed for memory, or an
    allocator failure it died of) or `interrupted`."""
    detail: str = ""
    """For a failure: exit code or signal, and the tail of the worker's stderr."""
    worker_replaced: bool = False
    seconds: float = 0.0
    rank_result: Optional[dict[str, Any]] = None
    """For one rank of a multi-rank case: what that rank made of it (run/ranks/worker_side.py)."""
    compile_grace_used_s: float = 0.0
    """How far past its --case-timeout the case's deadline moved while its worker compiled kernels."""


_SPAWNER: Optional[ThreadPoolExecutor] = None
_SPAWNER_LOCK = threading.Lock()


def _forget_spawner() -> None:
    global _SPAWNER
    _SPAWNER = None                   # a forked child has no thread behind the parent's executor


os.register_at_fork(after_in_child=_forget_spawner)


def _popen_from_a_lasting_thread(args: list[str], **kwargs: Any) -> subprocess.Popen[str]:
    """`subprocess.Popen(args, **kwargs)`, forked from one thread that lives as long as this process.

    A worker asks the kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG), and the kernel
    means the thread that forked it: a worker a slot thread started was killed the moment that
    thread ended, at the end of every run, before it could stop what its backend had started."""
    global _SPAWNER
    with _SPAWNER_LOCK:
        if _SPAWNER is None:
            _SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ox-spawn")
        spawner = _SPAWNER
    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(args, **kwargs)

    return spawner.submit(start).result()


def _describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


@dataclass
class WorkerProcess:
    """One spawned worker process and the thread that reads its messages."""

    spec: JobSpec
    env: dict[str, str]
    name: str
    cpu_share: Optional[int] = None
    proc: Optional[subprocess.Popen[str]] = field(default=None, init=False)
    info: dict[str, Any] = field(default_factory=dict, init=False)
    _inbox: queue.Queue[Optional[WorkerMessage]] = field(default_factory=queue.Queue, init=False)
    _log: Optional[WorkerLog] = field(default=None, init=False)
    """The worker's stdout and stderr, capped (run/worker_log.py)."""
    session_token: str = field(default_factory=new_token, init=False)
    """In the worker's environment and everything it starts: how `kill` finds them (run/session.py)."""
    _cgroup: MemoryCgroup = field(default_factory=MemoryCgroup, init=False)
    peak_rss_bytes: Optional[int] = field(default=None, init=False)
    """The largest resident set the parent sampled while the worker ran cases (OOM evidence)."""
    _t_spawn: float = field(default=0.0, init=False)
    _t_ready: Optional[float] = field(default=None, init=False)
    """When `ready` arrived (the reader's clock), not when the parent came to read it."""

    def spawn(self) -> None:
        """Start the process and hand it the job; it gets ready (Python, torch, CUDA, CUPTI: seconds)
        while the caller does other work."""
        self._t_spawn = time.monotonic()
        log_read, log_write = os.pipe()
        try:
            self.proc = _popen_from_a_lasting_thread(
                [sys.executable, "-m", "operatorx.run.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=log_write, env={**self.env, SESSION_ENV: self.session_token}, text=True,
                start_new_session=True, bufsize=1)
        except BaseException:
            os.close(log_read)
            raise
        finally:
            os.close(log_write)
        self._log = WorkerLog(log_read, self.name)
        self._cgroup = memory_cgroup(self.proc.pid)
        threading.Thread(target=self._read, daemon=True, name=f"read-{self.name}").start()
        assert self.proc.stdin is not None
        send(self.proc.stdin, "init", job=self.spec.worker_json(), cpu_share=self.cpu_share)   # no database URL

    def wait_ready(self, timeout_s: float = WORKER_START_TIMEOUT_S) -> dict[str, Any]:
        """Wait for the spawned worker's `ready`; its info. WorkerStartError (the worker killed) otherwise."""
        assert self.proc is not None
        msg = self._next(time.monotonic() + timeout_s)
        if msg is None or msg.kind != "ready":
            reason = msg.body.get("message") if msg is not None and msg.kind == "failed" else None
            if reason is None:
                reason = "no answer in time" if msg is None and self.alive() else _describe_exit(self.proc.poll())
            self.kill()
            if self._log is not None:
                self._log.drain()
            raise WorkerStartError(f"worker {self.name} did not start: {reason}\n{self.stderr_tail()}".rstrip())
        self.info = msg.body.get("info", {})
        if isinstance(self.info.get("startup_s"), dict):     # spawn to ready: Python, imports, CUDA, the job
            ready_at = self._t_ready if self._t_ready is not None else time.monotonic()
            self.info["startup_s"]["spawn_to_ready"] = round(ready_at - self._t_spawn, 4)
        return self.info

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = parse(line)
            if msg is not None:
                if msg.kind == "ready":
                    self._t_ready = time.monotonic()
                self._inbox.put(msg)
        self._inbox.put(None)                          # end of stream: the worker is gone

    def _next(self, deadline: float) -> Optional[WorkerMessage]:
        """The next message before `deadline`; None at the deadline or when the stream ended."""
        try:
            return self._inbox.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _sample_rss(self) -> None:
        """Keep the largest resident set seen (one small /proc read, while a case runs)."""
        if self.proc is None:
            return
        rss = rss_bytes_of(self.proc.pid)
        if rss is not None and (self.peak_rss_bytes is None or rss > self.peak_rss_bytes):
            self.peak_rss_bytes = rss

    def run_case(self, index: int, case: Case, deadline_s: float, stop: threading.Event) -> CaseOutcome:
        """Hand one case over and wait for its row, at most `deadline_s` seconds."""
        if not self.send_case(index, case):
            return self._failure(index, "crashed", time.monotonic())
        return self.await_case(index, deadline_s, stop)

    def send_case(self, index: int, case: Case, ahead: bool = False, rank: Optional[dict[str, Any]] = None) -> bool:
        """Write the case to the worker's stdin; False when the pipe is gone (the worker died), or
        when a case sent `ahead` (the worker busy with another) is longer than AHEAD_MAX_BYTES. The
        worker reads it when it is done with the case before, so a case sent ahead starts at once.
        `rank`: the worker's rank in a multi-rank case (run/ranks/assignment.py)."""
        assert self.proc is not None and self.proc.stdin is not None
        body: dict[str, Any] = {"index": index, "case": case.to_json(), **({"rank": rank} if rank is not None else {})}
        line = WorkerMessage("case", body).to_line()
        if ahead and len(line.encode()) > AHEAD_MAX_BYTES:
            return False
        try:
            self.proc.stdin.write(line)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return False
        return True

    def await_case(self, index: int, deadline_s: float, stop: threading.Event) -> CaseOutcome:
        """Wait for the row of a case already sent. Its `deadline_s` counts from its `started` (or
        from now until then: a case sent ahead waits for the one before it, not on its own clock).
        Time its worker spent compiling kernels does not count, up to `compile_grace_s` more
        (`_compile_extension_s`): a cold JIT cache is not a hang."""
        t0 = time.monotonic()
        deadline = t0 + deadline_s
        compiled_from_s, extended_s = self._reaped_cpu_s(), 0.0
        while True:
            msg = self._next(min(deadline, time.monotonic() + 0.25))
            self._sample_rss()
            if msg is not None and msg.kind == "row" and msg.body.get("index") == index:
                return CaseOutcome(index=index, row=msg.body["row"], worker_replaced=bool(msg.body.get("replace")),
                                   seconds=time.monotonic() - t0, rank_result=msg.body.get("rank_result"),
                                   compile_grace_used_s=extended_s)
            if msg is not None and msg.kind == "started" and msg.body.get("index") == index:
                t0 = time.monotonic()
                deadline = t0 + deadline_s
                compiled_from_s, extended_s = self._reaped_cpu_s(), 0.0
            if msg is not None:
                continue                               # `started`, or a stray line
            if not self.alive() and self._inbox.empty():
                # after a stop signal the scheduler kills the workers whose grace ran out: not a crash
                return self._failure(index, "interrupted" if stop.is_set() else "crashed", t0)
            if time.monotonic() >= deadline:
                more_s = self._compile_extension_s(compiled_from_s, extended_s)
                if more_s > 0:
                    deadline, extended_s = deadline + more_s, extended_s + more_s
                    continue
                why = f"no row after {deadline_s:.0f} s (--case-timeout)"
                if extended_s > 0:
                    why += f" and {extended_s:.0f} s more while its worker compiled kernels (--compile-grace)"
                return self._failure(index, "timeout", t0, why)

    def _reaped_cpu_s(self) -> float:
        pid = self.proc.pid if self.proc is not None else None
        got = reaped_children_cpu_s(pid) if pid is not None else None
        return got if got is not None else 0.0

    def _compile_extension_s(self, compiled_from_s: float, extended_s: float) -> float:
        """How much later a case at its deadline may end, 0 for none: the CPU time of the compilers its
        worker ran and waited for since the case started, less what was granted already, and at least
        COMPILE_STEP_S while a compiler of its session runs now; within `compile_grace_s` in all."""
        left_s = self.spec.config.compile_grace_s - extended_s
        if left_s <= 0 or self.proc is None:
            return 0.0
        owed_s = self._reaped_cpu_s() - compiled_from_s - extended_s
        if compilers_running(self.session_token, self.proc.pid):
            owed_s = max(owed_s, COMPILE_STEP_S)
        return min(left_s, max(0.0, owed_s))

    def _failure(self, index: int, failure: str, t0: float, why: str = "") -> CaseOutcome:
        """The case's outcome when its worker gave no row. A worker that died is killed with its whole
        session first (what it started must not outlive it), and its log read to the end. A death
        the kernel's OOM killer or an allocator failure explains is `oom`, not `crashed`."""
        if failure == "timeout":
            self._ask_for_stacks()
            self.kill()
        else:
            self.wait(5.0)
            self.kill()
        code = self.proc.poll() if self.proc is not None else None
        if self._log is not None:
            self._log.drain()
        tail = self.stderr_tail(TIMEOUT_TAIL_BYTES if failure == "timeout" else STDERR_TAIL_BYTES)
        what = why or _describe_exit(code)
        where = hung_at(tail) if failure == "timeout" else None
        if where is not None:
            what = f"{what}; its worker waited at {where}"
        if failure == "crashed":
            oom = self._oom_evidence(code, tail)
            if oom is not None:
                failure, what = "oom", f"{what}: {oom}"
        return CaseOutcome(index=index, failure=failure, detail=f"{what}\n{tail}".rstrip(),
                           worker_replaced=True, seconds=time.monotonic() - t0)

    def _ask_for_stacks(self) -> None:
        """STACKS_SIGNAL to a hung worker, then wait until its log has taken the stacks (quiet for 0.2 s
        after growing) or STACKS_WAIT_S passed, so the timeout's detail says where the case waited."""
        if self.proc is None or not self.alive() or self._log is None:
            return
        before = self._log.written_bytes
        try:
            os.kill(self.proc.pid, STACKS_SIGNAL)
        except (ProcessLookupError, PermissionError):
            return
        end, last, quiet_since = time.monotonic() + STACKS_WAIT_S, before, time.monotonic()
        while time.monotonic() < end:
            time.sleep(0.05)
            now = self._log.written_bytes
            if now != last:
                last, quiet_since = now, time.monotonic()
            elif now > before and time.monotonic() - quiet_since >= 0.2:
                return

    def _oom_evidence(self, code: Optional[int], tail: str) -> Optional[str]:
        """Why the worker's death was for memory, or None: a SIGKILL (the parent sent none: its own
        kills are timeouts and stops) with the OOM killer's count risen or the resident set near its
        limit (run/oom.py); an exit whose last log lines are an allocator failure (run/faults.py)."""
        if code == -signal.SIGKILL:
            limit = self._cgroup.limit_bytes()
            return oom_kill_evidence(self._cgroup, self.peak_rss_bytes, limit)
        if code is not None and died_of_allocation(tail):
            return "its log ends in an allocator failure"
        return None

    def wait(self, timeout_s: float) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL to the worker's whole session: its process group, and every process it started
        wherever it went (`setsid`, double forks: run/session.py), the worker itself last."""
        if self.proc is None:
            return
        root = self.proc.pid if self.proc.returncode is None else None    # a reaped pid may be reused
        kill_session(self.session_token, root)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def stop(self) -> None:
        """Ask the worker to end after its case; kill it if it does not within 10 s."""
        if self.proc is None:
            return
        if self.alive():
            try:
                assert self.proc.stdin is not None
                send(self.proc.stdin, "stop")
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            self.wait(10.0)
        self.kill()
        self.discard_log()

    def stderr_tail(self, nbytes: int = STDERR_TAIL_BYTES) -> str:
        """The end of what the worker wrote to its stdout and stderr (with a note when the log's cap
        dropped older output)."""
        return self._log.tail(nbytes) if self._log is not None else ""

    def discard_log(self) -> None:
        """Forget the worker's log (it is kept in memory only, within its cap)."""
        self._log = None


@dataclass
class Slot:
    """One place to run cases (a GPU, or a CPU share): keeps a worker alive across cases."""

    spec: JobSpec
    env: dict[str, str]
    name: str
    cpu_share: Optional[int] = None
    worker: Optional[WorkerProcess] = field(default=None, init=False)
    """The ready worker (None until one is)."""
    started_workers: int = field(default=0, init=False)
    _starting: Optional[WorkerProcess] = field(default=None, init=False)
    """The worker spawned but not ready yet (spawned ahead, or being started): `kill` and `close`
    reach it there while its slot thread waits for it."""
    _closed: bool = field(default=False, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def _new_process(self) -> WorkerProcess:
        self.started_workers += 1
        return WorkerProcess(spec=self.spec, env=self.env, name=self.name, cpu_share=self.cpu_share)

    def spawn_ahead(self) -> None:
        """Start this slot's first worker now, so it gets ready while the parent loads the testlist and
        stores the plan (a worker takes seconds to get ready, longer than the parent's part).
        A spawn that fails here is tried again, and reported, by `ensure_worker`."""
        with self._lock:
            if self._closed or self.worker is not None or self._starting is not None:
                return
            proc = self._starting = self._new_process()
        try:
            proc.spawn()
        except Exception:  # noqa: BLE001 - ensure_worker tries again and reports why it cannot start
            self._drop(proc)

    def ensure_worker(self) -> dict[str, Any]:
        """A ready worker (the one spawned ahead, or a fresh one if there is none); its info.
        WorkerStartError when it cannot start, or when the slot was killed or closed meanwhile."""
        with self._lock:
            if self.worker is not None and self.worker.alive():
                return self.worker.info
            if self.worker is not None:
                self.worker.discard_log()
                self.worker = None
            if self._closed:
                raise WorkerStartError(f"worker {self.name}: the slot is closed")
            proc, ahead = self._starting, self._starting is not None
            if proc is None:
                proc = self._starting = self._new_process()
        try:
            if not ahead:
                proc.spawn()
            proc.wait_ready()
        except Exception:
            self._drop(proc)
            raise
        with self._lock:
            stopped = self._starting is not proc     # killed or closed while it started
            if not stopped:
                self._starting, self.worker = None, proc
        if stopped:
            self._drop(proc)
            raise WorkerStartError(f"worker {self.name} was stopped while it started")
        return proc.info

    def _drop(self, proc: WorkerProcess) -> None:
        """Kill a worker that did not become this slot's, and forget it."""
        proc.kill()
        proc.discard_log()
        with self._lock:
            if self._starting is proc:
                self._starting = None

    def run(self, index: int, case: Case, deadline_s: float, stop: threading.Event) -> CaseOutcome:
        self.ensure_worker()
        assert self.worker is not None
        return self._settled(self.worker.run_case(index, case, deadline_s, stop))

    def send_case(self, index: int, case: Case, ahead: bool = False, rank: Optional[dict[str, Any]] = None) -> bool:
        """Hand a case to the ready worker without waiting (`await_case` collects its row): the
        scheduler sends the next case `ahead` while this one runs, so the worker does not wait for
        the parent between cases.
        False when it was not sent (see WorkerProcess.send_case)."""
        worker = self.worker
        return worker is not None and worker.alive() and worker.send_case(index, case, ahead=ahead, rank=rank)

    def await_case(self, index: int, deadline_s: float, stop: threading.Event) -> CaseOutcome:
        """The row of a case handed over with `send_case`."""
        worker = self.worker
        if worker is None:
            return CaseOutcome(index=index, failure="crashed", worker_replaced=True,
                               detail="the worker was gone before the case started")
        return self._settled(worker.await_case(index, deadline_s, stop))

    def _settled(self, outcome: CaseOutcome) -> CaseOutcome:
        """Retire the worker when the case ended it (a failure, or a row that asks for a fresh one)."""
        if outcome.worker_replaced and self.worker is not None:
            self.worker.wait(10.0)                   # it exits by itself after a poisoning case
            self.worker.kill()
            self.worker.discard_log()
            self.worker = None
        return outcome

    def kill(self) -> None:
        """SIGKILL to the worker, ready or starting (a starting one's slot thread then gets WorkerStartError)."""
        with self._lock:
            procs = [p for p in (self.worker, self._starting) if p is not None]
        for proc in procs:
            proc.kill()

    def close(self) -> None:
        """Stop the worker, ready or starting; no worker starts in this slot afterwards."""
        with self._lock:
            self._closed = True
            procs = [p for p in (self.worker, self._starting) if p is not None]
            self.worker = self._starting = None
        for proc in procs:
            proc.stop()
