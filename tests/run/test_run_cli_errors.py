"""`operatorx run` refuses what cannot work before anything runs: one line, exit 2, nothing stored."""

from __future__ import annotations

import importlib.util
import os

import pytest
from typer.testing import CliRunner

from operatorx.cli import app
from tests.conftest import gemm


def _run(tmp_path, *args):
    return CliRunner().invoke(app, ["run", "--device", "cpu", "--db", str(tmp_path / "ox.db"),
                                    "--results-dir", str(tmp_path / "res"), *args])


def test_a_filter_that_selects_nothing_is_an_error(tmp_path, write_testlist):
    done = _run(tmp_path, "-t", str(write_testlist([gemm()])), "--filter", "no-such-model")
    assert done.exit_code == 2 and "no case to run (--filter 'no-such-model' selects none of its 1 cases)" in \
        done.output
    assert not (tmp_path / "ox.db").exists()


def test_an_empty_testlist_is_an_error(tmp_path, write_testlist):
    done = _run(tmp_path, "-t", str(write_testlist([])))
    assert done.exit_code == 2 and "the testlist is empty" in done.output


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_missing_says_how_to_install_it(tmp_path, write_testlist):
    done = _run(tmp_path, "-t", str(write_testlist([gemm()])), "--backend", "vllm")
    assert done.exit_code == 2 and "vLLM is not installed" in done.output and 'pip install -e ".[vllm]"' in \
        done.output


@pytest.mark.parametrize("run_id", ["../../escaped", "a b", ".hidden", "x" * 65])
def test_a_run_id_that_is_not_a_plain_name_is_refused(tmp_path, write_testlist, run_id):
    done = _run(tmp_path, "-t", str(write_testlist([gemm()])), "--run-id", run_id)
    assert done.exit_code == 2 and "run id" in done.output and "Traceback" not in done.output
    assert not (tmp_path.parent / "escaped.json").exists()


def test_reusing_a_run_id_is_one_line(tmp_path, write_testlist):
    tl = str(write_testlist([gemm(m=2, n=64, k=64, a={"dtype": "fp32"}, b={"dtype": "fp32"}, out="fp32")]))
    first = _run(tmp_path, "-t", tl, "--run-id", "same", "--executor", "inline", "--max-time", "0")
    assert first.exit_code == 0, first.output
    again = _run(tmp_path, "-t", tl, "--run-id", "same", "--executor", "inline")
    assert again.exit_code == 2 and "Traceback" not in again.output and "same" in again.output


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_a_results_dir_that_cannot_be_written_fails_first(tmp_path, write_testlist):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    done = _run(tmp_path, "-t", str(write_testlist([gemm()])), "--results-dir", str(locked / "res"))
    assert done.exit_code == 2 and "--results-dir" in done.output and not (tmp_path / "ox.db").exists()


def test_a_results_dir_that_is_a_file_fails_first(tmp_path, write_testlist):
    (tmp_path / "file").write_text("x")
    done = CliRunner().invoke(app, ["run", "--device", "cpu", "--db", str(tmp_path / "ox.db"), "-t",
                                    str(write_testlist([gemm()])), "--results-dir", str(tmp_path / "file")])
    assert done.exit_code == 2 and "--results-dir" in done.output and not (tmp_path / "ox.db").exists()


def test_strict_takes_no_value_and_has_a_negative(tmp_path, write_testlist):
    tl = str(write_testlist([gemm(m=2, n=64, k=64, a={"dtype": "fp32"}, b={"dtype": "fp32"}, out="fp32")]))
    assert _run(tmp_path, "-t", tl, "--no-strict", "--executor", "inline", "--max-time", "0").exit_code == 0
