"""A worker's whole session dies with it, its log is capped, and memory failures read `oom`:
real worker processes on the CPU device, with a planted backend (planted/hostile_env.py) that
double-forks grandchildren, floods fd 1, raises MemoryError, allocates past an RLIMIT_AS and
dies by SIGKILL with its resident set near a limit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from operatorx.measure import TimingSettings
from operatorx.run import RunConfig, run_testlist
from operatorx.run.faults import classify_message, died_of_allocation
from operatorx.run.session import SESSION_ENV, kill_session, new_token, session_processes
from operatorx.run.worker_log import WorkerLog
from tests.conftest import gemm

PLANTED = Path(__file__).parent / "planted" / "hostile_env.py"
FAST = TimingSettings(warmup_calls=1, warmup_floor_s=0, first_warmup_floor_s=0, min_samples=3, max_samples=5,
                      max_time_s=0)
OK_M = 20
_MIB = 1024 * 1024


def fp32(m: int) -> dict:
    return gemm(m=m, n=64, k=64, a={"dtype": "fp32"}, b={"dtype": "fp32"}, out="fp32")


def config(tmp_path: Path, testlist: Path, params: str = "", **kw) -> RunConfig:
    backend = f"py:{PLANTED}:build" + (f"[{params}]" if params else "")
    return RunConfig(testlist=str(testlist), backend=backend, device="cpu", db=str(tmp_path / "ox.db"),
                     results_dir=tmp_path / "res", timing=FAST, **kw)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


def _pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _wait_dead(pids: list[int], timeout_s: float = 60) -> list[int]:
    """The pids still alive after `timeout_s` (SIGKILL is delivered asynchronously)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        living = [p for p in pids if _alive(p)]
        if not living:
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


# --- a backend's session ----------------------------------------------------------------------

def test_grandchildren_die_when_their_worker_is_replaced_and_when_the_run_ends(tmp_path, write_testlist):
    """m=12 double-forks a grandchild (setsid) and its worker exits: the grandchild was re-parented
    to init, and only its token finds it; m=14, on the fresh worker, fails unless those grandchildren
    are already dead. m=13 double-forks one with an empty environment in a worker that lives on: the
    worker, its subreaper, kills it when the run ends."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    cases = [fp32(12), fp32(14), fp32(13), fp32(OK_M)]
    outcome = run_testlist(config(tmp_path, write_testlist(cases), f"pid_dir={pid_dir}", workers=1))
    by_m = {r.case.args.m: r for r in outcome.rows}
    assert (by_m[12].status, by_m[12].error_kind) == ("error", "crashed"), by_m[12].message
    assert by_m[14].status == "ok", by_m[14].message             # the replaced worker's grandchildren were gone
    assert by_m[13].status == "ok" and by_m[OK_M].status == "ok"
    replaced, kept = _pids(pid_dir / "m12.pids"), _pids(pid_dir / "m13.pids")
    assert len(replaced) == 2 and len(kept) == 1                  # m=12 was tried twice
    assert _wait_dead(replaced + kept) == []


def test_kill_session_kills_a_tree_and_the_token_holders_it_left(tmp_path):
    """No torch: a shell starts a sleeper with an empty environment (found through the tree) and a
    `setsid` shell whose sleeper keeps the token (found by it, outside the root's session)."""
    token = new_token()
    script = ("sleep 1000 & env -i sleep 1000 & echo $! > " + str(tmp_path / "bare.pid") + "; "
              "setsid sh -c 'sleep 1000 & echo $! > " + str(tmp_path / "away.pid") + "; wait' & wait")
    root = subprocess.Popen(["sh", "-c", script], env={**os.environ, SESSION_ENV: token}, start_new_session=True)
    try:
        end = time.monotonic() + 60
        while not ((tmp_path / "away.pid").exists() and (tmp_path / "bare.pid").exists()
                   and len(session_processes(token, root.pid)) >= 5):
            assert time.monotonic() < end, "the planted processes did not start"
            time.sleep(0.05)
        away = int((tmp_path / "away.pid").read_text())
        bare = int((tmp_path / "bare.pid").read_text())
        assert {away, bare, root.pid} <= session_processes(token, root.pid)
        assert kill_session(token, root.pid) >= 5
        assert _wait_dead([away, bare]) == []
        assert root.wait(timeout=60) == -signal.SIGKILL
        assert session_processes(token) == set()
    finally:
        if root.poll() is None:
            root.kill()


# --- the worker's log -------------------------------------------------------------------------

def test_the_log_keeps_a_capped_tail_and_says_what_it_dropped():
    r, w = os.pipe()
    log = WorkerLog(r, "t", kept_bytes=64 * 1024)

    def write() -> None:
        chunk = b"y" * (_MIB - 1) + b"\n"
        for _ in range(8):
            os.write(w, chunk)
        os.write(w, b"last words\n")
        os.close(w)

    threading.Thread(target=write).start()
    log.drain(timeout_s=60)
    assert log.written_bytes == 8 * _MIB + len(b"last words\n")
    assert log.dropped_bytes == log.written_bytes - 64 * 1024
    tail = log.tail(2000)
    assert tail.startswith("[worker output capped: ") and tail.endswith("last words")
    assert len(tail) < 2300


def test_a_backend_flooding_fd_1_costs_a_capped_tail_not_the_disk(tmp_path, write_testlist):
    outcome = run_testlist(config(tmp_path, write_testlist([fp32(15), fp32(OK_M)]), "flood_mib=64", workers=1))
    flood, ok = sorted(outcome.rows, key=lambda r: r.case.args.m)
    assert (flood.status, flood.error_kind) == ("error", "crashed") and ok.status == "ok"
    tail = flood.metrics["worker_stderr_tail"]
    assert "worker output capped: " in tail and tail.rstrip().endswith("the last line before the exit")
    assert len(tail) < 4000


# --- memory failures --------------------------------------------------------------------------

@pytest.mark.parametrize("message", ["MemoryError: ", "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. "
                                     "DefaultCPUAllocator: can't allocate memory: you tried to allocate 4294967296 "
                                     "bytes. Error code 12 (Cannot allocate memory)",
                                     "RuntimeError: CPU: not enough memory",
                                     "OSError: [Errno 12] Cannot allocate memory", "std::bad_alloc"])
def test_allocator_failures_read_oom(message):
    assert classify_message(message) == "oom"


def test_a_dead_worker_reads_oom_only_when_its_last_lines_say_so():
    assert died_of_allocation("loading\nterminate called after throwing an instance of 'std::bad_alloc'\n"
                              "  what():  std::bad_alloc")
    assert died_of_allocation("Traceback (most recent call last):\n  ...\nMemoryError")
    assert not died_of_allocation("warning: out of memory once\n" + "fine\n" * 5)
    assert classify_message("RuntimeError: CUDA error: an illegal memory access was encountered") == "cuda_fault"


def test_memory_error_and_an_rlimit_as_allocation_are_oom(tmp_path, write_testlist):
    outcome = run_testlist(config(tmp_path, write_testlist([fp32(10), fp32(11), fp32(OK_M)]), workers=1))
    by_m = {r.case.args.m: r for r in outcome.rows}
    for m in (10, 11):
        assert (by_m[m].status, by_m[m].error_kind) == ("error", "oom"), (m, by_m[m].message)
    assert by_m[10].message.startswith("MemoryError")
    assert "Cannot allocate memory" in by_m[11].message
    assert by_m[OK_M].status == "ok"


def test_a_sigkill_with_the_resident_set_near_its_limit_is_oom(tmp_path, write_testlist, monkeypatch):
    """The OOM killer's SIGKILL, as the parent sees it: the worker's sampled resident set reached its
    limit (here the limit is what the backend said it holds, over 0.95), then SIGKILL. The backend
    waits until the parent's sampling has seen its memory: no timing assumed."""
    from operatorx.run import oom, worker_process

    marker = tmp_path / "sampled"
    rss_file = Path(f"{marker}.rss")
    real = worker_process.rss_bytes_of

    def sampled(pid: int):
        rss = real(pid)
        if rss is not None and rss_file.exists() and rss >= int(rss_file.read_text()):
            marker.touch()
        return rss

    monkeypatch.setattr(worker_process, "rss_bytes_of", sampled)
    monkeypatch.setattr(oom.MemoryCgroup, "limit_bytes", lambda self: int(int(rss_file.read_text()) / 0.95))
    outcome = run_testlist(config(tmp_path, write_testlist([fp32(16), fp32(OK_M)]), f"marker={marker}",
                                  workers=1))
    killed, ok = sorted(outcome.rows, key=lambda r: r.case.args.m)
    assert (killed.status, killed.error_kind) == ("error", "oom"), killed.message
    assert "killed by signal SIGKILL: its resident set had reached" in killed.message
    assert [f.split(":")[0] for f in killed.metrics["failures"]] == ["oom", "oom"]    # tried once more
    assert ok.status == "ok"


def test_a_sigkill_without_memory_evidence_stays_crashed(tmp_path):
    """The evidence rule itself: no cgroup count risen and a resident set far from the limit."""
    from operatorx.run.oom import MemoryCgroup, oom_kill_evidence

    assert oom_kill_evidence(MemoryCgroup(), 100 * _MIB, 10_000 * _MIB) is None
    assert oom_kill_evidence(MemoryCgroup(), 9_500 * _MIB, 10_000 * _MIB) is not None
    group = MemoryCgroup(dirs=(tmp_path,), events_file="memory.events", oom_kills_at_start=(3,))
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 2\noom 1\noom_kill 4\n")
    assert "oom_kill 3 -> 4" in (oom_kill_evidence(group, None, None) or "")


def test_the_worker_process_module_runs_no_torch_in_the_parent():
    """The session, log and OOM helpers are the parent's: importing them must not import torch."""
    done = subprocess.run([sys.executable, "-c", "import sys, operatorx.run.worker_process, operatorx.run.session, "
                           "operatorx.run.oom, operatorx.run.worker_log; print('torch' in sys.modules)"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
