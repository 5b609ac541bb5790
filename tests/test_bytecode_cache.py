"""The bytecode cache: used only where the environment ships no bytecode and forbids writing it, and
then really read and written under the prefix tree, never next to the sources."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from operatorx.bytecode_cache import ENV_DIR, ENV_SWITCH, bytecode_cache_dir, wanted, worker_env
from operatorx.user_cache import cache_root

TAG = sys.implementation.cache_tag


def _package(root: Path, name: str, shipped_bytecode: bool) -> Path:
    """A package on `root` with one module; with `shipped_bytecode` its .pyc files are compiled next
    to the sources, as pip installs them."""
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 41 + 1\n")
    if shipped_bytecode:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(pkg)], check=True)
    return pkg


@pytest.fixture
def packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "site"
    _package(root, "oxprobe_bare", shipped_bytecode=False)
    _package(root, "oxprobe_shipped", shipped_bytecode=True)
    monkeypatch.syspath_prepend(str(root))
    return root


def test_only_an_environment_without_bytecode_that_forbids_writing_it_gets_the_cache(packages: Path,
                                                                                       tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    tree = tmp_path / "xdg" / "operatorx" / "pycache"
    assert wanted(env, writes_off=True, prefix_set=False, probe_package="oxprobe_bare") == tree
    assert tree.is_dir()
    assert wanted(env, writes_off=False, prefix_set=False, probe_package="oxprobe_bare") is None  # Python writes
    assert wanted(env, writes_off=True, prefix_set=True, probe_package="oxprobe_bare") is None   # the user's tree
    assert wanted(env, writes_off=True, prefix_set=False, probe_package="oxprobe_shipped") is None  # shipped: read
    for off in ("0", "false", "OFF", "no"):
        assert wanted({**env, ENV_SWITCH: off}, writes_off=True, prefix_set=False, probe_package="oxprobe_bare") is None
    assert wanted(env, writes_off=True, prefix_set=False, probe_package="oxprobe_not_installed") == tree


def test_no_tree_it_can_make_leaves_the_environment_as_it_was(packages: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # a tree that cannot be made (a file where its folder should be) would make Python compile even
    # the standard library in every process: not used
    (tmp_path / "file").write_text("")
    env = {"PYTHONDONTWRITEBYTECODE": "1", ENV_DIR: str(tmp_path / "file" / "pycache")}
    assert worker_env(env, probe_package="oxprobe_bare") is env
    # no home directory (a container under a user with no passwd entry): Path.home() raises

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    bare = {"PYTHONDONTWRITEBYTECODE": "1"}
    assert worker_env(bare, probe_package="oxprobe_bare") is bare


def test_the_worker_env_moves_writes_into_the_tree_and_leaves_the_rest(packages: Path, tmp_path: Path) -> None:
    env = {"PYTHONDONTWRITEBYTECODE": "1", "XDG_CACHE_HOME": str(tmp_path / "xdg"), "KEEP": "me"}
    out = worker_env(env, probe_package="oxprobe_bare")
    assert "PYTHONDONTWRITEBYTECODE" not in out and out["KEEP"] == "me"
    assert out["PYTHONPYCACHEPREFIX"] == str(tmp_path / "xdg" / "operatorx" / "pycache")
    assert worker_env({**env, ENV_DIR: str(tmp_path / "mine")}, probe_package="oxprobe_bare")["PYTHONPYCACHEPREFIX"] \
        == str(tmp_path / "mine")
    assert worker_env(env, probe_package="oxprobe_shipped") is env
    assert worker_env({"KEEP": "me"}, probe_package="oxprobe_bare") == {"KEEP": "me"}


def _import_in_child(env: dict[str, str], packages: Path) -> None:
    child = {**env, "PYTHONPATH": str(packages)}
    done = subprocess.run([sys.executable, "-c", "import oxprobe_bare; assert oxprobe_bare.VALUE == 42"], env=child,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_spawned_process_writes_its_bytecode_in_the_tree_not_by_the_sources(packages: Path, tmp_path: Path) -> None:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX", ENV_DIR)}
    env = worker_env({**base, "PYTHONDONTWRITEBYTECODE": "1", "XDG_CACHE_HOME": str(tmp_path / "xdg")},
                     probe_package="oxprobe_bare")
    source = packages / "oxprobe_bare" / "__init__.py"
    cached = Path(env["PYTHONPYCACHEPREFIX"] + str(source.parent)) / f"__init__.{TAG}.pyc"
    _import_in_child(env, packages)
    assert cached.is_file() and not (source.parent / "__pycache__").exists()
    written = cached.stat().st_mtime_ns
    _import_in_child(env, packages)                      # the second process reads it: nothing is written again
    assert cached.stat().st_mtime_ns == written
    # the environment as it was: nothing written anywhere
    _import_in_child({**base, "PYTHONDONTWRITEBYTECODE": "1"}, packages)
    assert not (source.parent / "__pycache__").exists()


def test_the_parent_process_switches_its_own_imports_over(packages: Path, tmp_path: Path) -> None:
    code = ("import sys; from operatorx.bytecode_cache import enable_in_process; "
            "tree = enable_in_process(probe_package='oxprobe_bare'); import oxprobe_bare; "
            "print(tree, sys.dont_write_bytecode)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(packages), *sys.path]),
           "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    env.pop("PYTHONPYCACHEPREFIX", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)            # -B alone turns writes off below
    done = subprocess.run([sys.executable, "-B", "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    tree = bytecode_cache_dir(env)
    assert done.stdout.split() == [str(tree), "False"]
    assert (Path(str(tree) + str(packages / "oxprobe_bare")) / f"__init__.{TAG}.pyc").is_file()
    # with writes allowed (no -B), the process is left as it was
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["None", "False"]


def test_peaks_share_the_cache_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from operatorx.platform.calibrate import peaks_dir

    monkeypatch.delenv("OPERATORX_PEAKS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert peaks_dir() == tmp_path / "operatorx" / "peaks"
    assert bytecode_cache_dir(os.environ) == tmp_path / "operatorx" / "pycache"
    assert cache_root(os.environ) == tmp_path / "operatorx"


def test_the_switch_imports_nothing_that_the_cache_should_have_held() -> None:
    """What the command imports before the cache is on is compiled from source on such an image."""
    code = ("import sys, operatorx.bytecode_cache\n"
            "print(','.join(m for m in sys.modules if m.startswith(('pydantic', 'operatorx.platform', 'typer'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == ""
