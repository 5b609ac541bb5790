"""`operatorx testlist generate` and `operatorx testlist from-config`: parse, call catalog, write.

Mounted by the main CLI: `register(testlist_app)`. Errors print one clear line (naming the
field) and exit 2; nothing is written unless every case was produced (dump_testlist writes a
temp file and renames it).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer

from operatorx.catalog import CatalogError, CatalogWarning, from_config, generate
from operatorx.spec import dump_testlist

__all__ = ["register"]

_MODELS_HELP = "checkpoint id, name or family (repeat); default: the whole catalog"
_TP_HELP = "TP size 1/2/4/8 (repeat); default: each checkpoint as deployed"
_M_HELP = "GEMM M (repeat); default decode 1..256 + prefill 512..32768"
_MOE_HELP = "also emit MoE layers at these token counts (repeat)"


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def _write(cases: list, output: Path, caught: list) -> None:
    for w in caught:
        typer.echo(f"warning: {w.message}", err=True)
    if not cases:
        _fail("no cases were produced; nothing written")
    dump_testlist(cases, output)
    typer.echo(f"wrote {len(cases)} cases to {output}")


def generate_cmd(
    output: Annotated[Path, typer.Option("-o", "--output", help="testlist JSON to write")],
    models: Annotated[Optional[list[str]], typer.Option("--models", help=_MODELS_HELP)] = None,
    tp: Annotated[Optional[list[int]], typer.Option("--tp", help=_TP_HELP)] = None,
    m: Annotated[Optional[list[int]], typer.Option("--m", help=_M_HELP)] = None,
    moe_tokens: Annotated[Optional[list[int]], typer.Option("--moe-tokens", help=_MOE_HELP)] = None,
    scheme: Annotated[Optional[list[str]], typer.Option("--scheme", help="only these scheme names (repeat)")] = None,
) -> None:
    """Cases for catalog checkpoints x schemes x TP x M, deduplicated with sources unioned."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CatalogWarning)
        try:
            cases = generate(models, tp, m, tuple(moe_tokens or ()), scheme)
        except CatalogError as err:
            _fail(str(err))
    _write(cases, output, [w for w in caught if issubclass(w.category, CatalogWarning)])


def from_config_cmd(
    config: Annotated[Path, typer.Argument(help="a Hugging Face config.json, read offline")],
    scheme: Annotated[str, typer.Option("--scheme", help="preset: bf16, fp8_tensor, fp8_channel, fp8_block, ...")],
    tp: Annotated[int, typer.Option("--tp", help="tensor-parallel size: 1, 2, 4 or 8")],
    output: Annotated[Path, typer.Option("-o", "--output", help="testlist JSON to write")],
    m: Annotated[Optional[list[int]], typer.Option("--m", help=_M_HELP)] = None,
) -> None:
    """Cases for any dense-GQA, MLA or MoE config.json; a missing field is an error naming it."""
    try:
        cases = from_config(config, scheme, tp, m)
    except CatalogError as err:
        _fail(str(err))
    _write(cases, output, [])


def register(app: typer.Typer) -> None:
    """Add `generate` and `from-config` to the `testlist` sub-app."""
    app.command("generate")(generate_cmd)
    app.command("from-config")(from_config_cmd)
