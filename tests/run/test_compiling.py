"""What the parent reads of a worker's compiles: compilers running in its session, reaped children's CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from operatorx.run.compiling import COMPILER_NAMES, compilers_running, reaped_children_cpu_s
from operatorx.run.session import SESSION_ENV, new_token

BUSY = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass"


def _named(tmp_path: Path, name: str) -> str:
    """This Python under another process name (the kernel names a process after the file it ran)."""
    link = tmp_path / name
    link.symlink_to(sys.executable)
    return str(link)


def test_a_compiler_in_the_session_is_found_by_name_and_only_while_it_runs(tmp_path: Path) -> None:
    token = new_token()
    env = {**os.environ, SESSION_ENV: token}
    nvcc = subprocess.Popen([_named(tmp_path, "nvcc"), "-c", "import time; time.sleep(30)"], env=env)
    other = subprocess.Popen([_named(tmp_path, "python-helper"), "-c", "import time; time.sleep(30)"], env=env)
    try:
        time.sleep(0.3)
        assert compilers_running(token, None) == ("nvcc",)
        assert compilers_running(new_token(), None) == ()          # another session's compiler is not ours
    finally:
        nvcc.kill(), other.kill(), nvcc.wait(), other.wait()
    assert compilers_running(token, None) == ()


def test_reaped_children_cpu_grows_by_the_busy_childs_time() -> None:
    before = reaped_children_cpu_s(os.getpid())
    assert before is not None
    subprocess.run([sys.executable, "-c", BUSY.format(s=0.6)], check=True)
    grown = reaped_children_cpu_s(os.getpid()) - before
    assert 0.4 <= grown <= 1.5, grown              # the busy loop's 0.6 s, plus the child's start-up


def test_a_gone_process_reads_as_none() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert reaped_children_cpu_s(dead.pid) is None


def test_the_names_fit_the_kernels_comm_field() -> None:
    assert all(len(n) <= 15 for n in COMPILER_NAMES)     # /proc/PID/comm holds 15 characters
