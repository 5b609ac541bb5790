"""The CLI commands: exit codes, messages, and no partial file on error."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from operatorx.cli.catalog import register
from operatorx.spec import load_testlist


def _app() -> typer.Typer:
    app, sub = typer.Typer(), typer.Typer()
    register(sub)
    app.add_typer(sub, name="testlist")
    return app


def test_generate_writes_file(tmp_path):
    out = tmp_path / "x.json"
    result = CliRunner().invoke(_app(), ["testlist", "generate", "--models", "Llama-3.1-8B-Instruct", "--tp", "1",
                                         "--m", "1", "--scheme", "bf16", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert len(load_testlist(out)) == 5


def test_from_config_bad_tp_writes_nothing(tmp_path, fixtures):
    out = tmp_path / "x.json"
    result = CliRunner().invoke(_app(), ["testlist", "from-config", str(fixtures / "dense_gqa_config.json"),
                                         "--scheme", "bf16", "--tp", "3", "-o", str(out)])
    assert result.exit_code != 0
    assert "tp must be one of" in result.output
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_generate_unknown_model(tmp_path):
    out = tmp_path / "x.json"
    result = CliRunner().invoke(_app(), ["testlist", "generate", "--models", "no-such-model", "-o", str(out)])
    assert result.exit_code != 0 and "unknown model 'no-such-model'" in result.output
    assert not out.exists()


def test_serving_writes_a_file_that_validates(tmp_path):
    from operatorx.cli import app

    out = tmp_path / "dsv3.json"
    result = CliRunner().invoke(app, ["testlist", "serving", "--model", "deepseek-v3", "--isl", "8192", "--osl", "1024",
                                      "--conc", "64", "--tp", "8", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote 28 cases" in result.output and "rope_theta" not in result.output   # the MLA module included
    cases = load_testlist(out, on_warning=lambda line: pytest.fail(line))          # count/step are case fields
    first = cases[0]
    assert (first.args.m, first.args.n, first.args.k, first.count, first.step) == (64, 2112, 7168, 61, "decode")
    assert sum(c.step == "prefill" for c in cases) == 14
    assert [(c.step, c.count) for c in cases if c.type == "mla"] == [("decode", 61), ("prefill", 61)]
    checked = CliRunner().invoke(app, ["testlist", "validate", str(out)])
    assert checked.exit_code == 0 and "ok" in checked.output and "28 cases" in checked.output


@pytest.mark.parametrize(("flags", "words"), [
    (["--model", "Llama-3.1-8B-Instruct", "--tp", "3"], "error: tp=3 does not divide num_attention_heads=32"),
    (["--model", "no-such-model"], "error: unknown model 'no-such-model'"),
    (["--model", "deepseek-v3", "--tp", "8", "--ep", "2"], "error: --ep 2: expert parallelism spans every rank"),
    (["--model", "deepseek-v3", "--scheme", "nvfp4"], "error: --scheme nvfp4: deepseek-ai/DeepSeek-V3 ships fp8_block"),
])
def test_serving_bad_flag_is_one_line(tmp_path, flags, words):
    out = tmp_path / "x.json"
    result = CliRunner().invoke(_app(), ["testlist", "serving", "--isl", "8192", "--osl", "1024", "--conc", "64",
                                         *flags, "-o", str(out)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].startswith(words), result.output
    assert "Traceback" not in result.output and not out.exists()
