"""Every command's --help keeps its bracketed text (`pip install -e ".[vllm]"`, `[key=value,...]`): the
help is plain text, never read as terminal markup that swallows brackets."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from operatorx.cli import app

_BRACKETS = re.compile(r"\[[^\[\]]*\]")


def _commands(cmd: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, cmd
    if hasattr(cmd, "commands"):            # a group (typer's own click types)
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(typer.main.get_command(app)))


def _flat(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_the_command_tree_is_walked():
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"run", "ab", "testlist validate", "testlist generate", "results show", "db ingest", "serve"} <= names


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=[" ".join(p) or "operatorx" for p, _ in COMMANDS])
def test_help_shows_every_bracketed_text(path, cmd):
    texts = [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]
    wanted = [m for t in texts for m in _BRACKETS.findall(t)]
    done = CliRunner().invoke(app, [*path, "--help"], terminal_width=120)
    assert done.exit_code == 0, done.output
    out = _flat(done.output)
    missing = [w for w in wanted if _flat(w) not in out]
    assert not missing, f"{' '.join(path)} --help lost {missing}"


def test_the_vllm_install_hint_survives_in_run_help():
    done = CliRunner().invoke(app, ["run", "--help"], terminal_width=200)
    assert 'pip install -e ".[vllm]"' in done.output and "[key=value,...]" in done.output
