"""Host memory for the CPU device: MemAvailable, capped by cgroup limits (fake /proc and /sys files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from operatorx.backends.base import Unsupported
from operatorx.backends.torch import memory
from operatorx.backends.torch.memory import host_memory, require_memory

GIB = 1 << 30
MEMINFO = """MemTotal:       24683520 kB
MemFree:          314572 kB
MemAvailable:    9227468 kB
Buffers:          102400 kB
Cached:          8388608 kB
"""


def _proc(tmp_path: Path, cgroup: str = "0::/\n", meminfo: str = MEMINFO) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(meminfo)
    (proc / "self" / "cgroup").write_text(cgroup)
    return proc


def test_available_counts_reclaimable_cache_not_just_free_pages(tmp_path):
    available, total = host_memory(_proc(tmp_path), tmp_path / "cgroup")
    assert available == 9227468 * 1024 and total == 24683520 * 1024   # 8.8 GiB, not the 0.3 GiB free


def test_a_cgroup_v2_limit_caps_what_is_available(tmp_path):
    root = tmp_path / "cgroup"
    (root / "job").mkdir(parents=True)
    (root / "job" / "memory.max").write_text(str(4 * GIB))
    (root / "job" / "memory.current").write_text(str(1 * GIB))
    available, total = host_memory(_proc(tmp_path, "0::/job\n"), root)
    assert (available, total) == (3 * GIB, 4 * GIB)


def test_a_parent_cgroup_limit_binds_the_child(tmp_path):
    root = tmp_path / "cgroup"
    (root / "outer" / "inner").mkdir(parents=True)
    (root / "outer" / "inner" / "memory.max").write_text("max\n")
    (root / "outer" / "memory.max").write_text(str(2 * GIB))
    (root / "outer" / "memory.current").write_text(str(GIB // 2))
    available, _ = host_memory(_proc(tmp_path, "0::/outer/inner\n"), root)
    assert available == GIB + GIB // 2


def test_a_cgroup_v1_limit_and_unlimited_v1(tmp_path):
    root = tmp_path / "cgroup"
    (root / "memory" / "docker").mkdir(parents=True)
    (root / "memory" / "docker" / "memory.limit_in_bytes").write_text(str(6 * GIB))
    (root / "memory" / "docker" / "memory.usage_in_bytes").write_text(str(2 * GIB))
    cg = "4:memory:/docker\n1:cpu:/\n"
    assert host_memory(_proc(tmp_path, cg), root) == (4 * GIB, 6 * GIB)
    (root / "memory" / "docker" / "memory.limit_in_bytes").write_text(str(2**63 - 4096))   # v1 "unlimited"
    assert host_memory(_proc(tmp_path / "b", cg), root)[0] == 9227468 * 1024


def test_unreadable_files_fall_back_to_sysconf(tmp_path):
    available, total = host_memory(tmp_path / "no-proc", tmp_path / "no-cgroup")
    assert 0 < available <= total


def test_the_refusal_says_available_and_uses_the_new_numbers(monkeypatch):
    monkeypatch.setattr(memory, "host_memory", lambda: (int(8.8 * GIB), 24 * GIB))
    require_memory(int(1.2 * GIB), "cpu")                      # the case: fits
    with pytest.raises(Unsupported, match=r"needs 9\.0 GiB on cpu; 8\.8 GiB free \(MemAvailable"):
        require_memory(9 * GIB, "cpu")
