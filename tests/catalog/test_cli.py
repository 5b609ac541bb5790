"""The CLI commands: exit codes, messages, and no partial file on error."""

from __future__ import annotations

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
