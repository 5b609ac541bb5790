"""The `operatorx` command's entry point (the console script and `python -m operatorx`).

It exists apart from `operatorx.cli` so that the bytecode cache (operatorx/bytecode_cache.py) is
switched on before the CLI's heavy imports (typer, rich, pydantic) in the command's own process
only: importing `operatorx.cli` from a test or a notebook changes nothing about that process.
"""

from __future__ import annotations

__all__ = ["main"]


def main() -> None:
    from operatorx.bytecode_cache import enable_in_process

    enable_in_process()        # an image that forbids .pyc files and ships none compiles them once, not per run
    from operatorx.cli import main as cli_main

    cli_main()
