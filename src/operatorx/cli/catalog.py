"""`operatorx testlist generate`, `from-config` and `serving`: parse, call catalog, write.

Mounted by the main CLI: `register(testlist_app)`. Errors print one clear line (naming the
field) and exit 2; nothing is written unless every case was produced (dump_testlist writes a
temp file and renames it).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from operatorx.report.safe import plain

# The catalog (checkpoint files, case models) is imported inside the commands: every command
# imports this module, to register these.

__all__ = ["register"]

_MODELS_HELP = ("checkpoint id, its name after the org, or a family (llama, qwen3, deepseek-v3, ...) "
                "(repeat); default: the whole catalog")
_TP_HELP = "TP size 1/2/4/8 (repeat); default: each checkpoint as deployed"
_M_HELP = "GEMM M (repeat); default decode 1..256 + prefill 512..32768"
_MOE_HELP = "also emit MoE layers at these token counts (repeat)"


def _fail(message: str) -> None:
    typer.echo(f"error: {plain(message)}", err=True)
    raise typer.Exit(code=2)


def _check_output(output: Path) -> None:
    """Before any work: -o names a file in a directory that exists."""
    if output.is_dir():
        _fail(f"-o {output}: is a directory; give a file name, e.g. {output / 'cases.json'}")
    if not output.parent.is_dir():
        _fail(f"-o {output}: directory {output.parent} does not exist; create it first")


def _family_matches(name: str, family: str) -> bool:
    """`llama` names `llama-3`, `qwen` names `qwen3-moe` and `qwen3.5-moe`, `deepseek` every deepseek-*."""
    return re.match(rf"{re.escape(name)}[\d.]*(-|$)", family) is not None


def expand_models(names: Optional[list[str]]) -> Optional[list[str]]:
    """Each name as the catalog knows it: an id, a name after the org, a family, or a family prefix
    (`llama`); CatalogError listing the families and the ids for a name that matches nothing."""
    from operatorx.catalog import CatalogError, load_catalog

    if not names:
        return names
    catalog = load_catalog()
    families = sorted({c.family for c in catalog})
    out: list[str] = []
    for name in names:
        low = name.strip().lower()
        exact = [c for c in catalog if low in (c.id.lower(), c.id.split("/")[-1].lower(), c.family.lower())]
        if exact:
            out.append(name)
            continue
        hits = [f for f in families if _family_matches(low, f.lower())]
        if not hits:
            raise CatalogError(f"unknown model '{name}'; give a family ({', '.join(families)}), a family prefix "
                               f"(llama, qwen, deepseek), or a checkpoint id ({', '.join(c.id for c in catalog)})")
        out += [f for f in hits if f not in out]
    return out


def _write(cases: list[Any], output: Path, caught: list[Any]) -> None:
    for w in caught:
        typer.echo(f"warning: {plain(w.message)}", err=True)
    if not cases:
        _fail("no cases were produced; nothing written")
    from operatorx.spec.testlist import dump_testlist

    try:
        dump_testlist(cases, output)
    except OSError as err:
        _fail(f"-o {output}: cannot write: {err.strerror or err}")
    typer.echo(f"wrote {len(cases)} {'case' if len(cases) == 1 else 'cases'} to {output}")


def generate_cmd(
    output: Annotated[Path, typer.Option("-o", "--output", help="testlist JSON to write")],
    models: Annotated[Optional[list[str]], typer.Option("--models", help=_MODELS_HELP)] = None,
    tp: Annotated[Optional[list[int]], typer.Option("--tp", help=_TP_HELP)] = None,
    m: Annotated[Optional[list[int]], typer.Option("--m", help=_M_HELP)] = None,
    moe_tokens: Annotated[Optional[list[int]], typer.Option("--moe-tokens", help=_MOE_HELP)] = None,
    scheme: Annotated[Optional[list[str]], typer.Option("--scheme", help="only these scheme names (repeat)")] = None,
    parallel: Annotated[bool, typer.Option(
        "--parallel", help="whole layers with their split (`parallel: {tp}`, upstream's *_parallel lists) instead "
                           "of the per-rank GEMMs one GPU runs")] = False,
    attention: Annotated[bool, typer.Option(
        "--attention", help="add each checkpoint's attention module: decode at 1/16/64/256 requests over 1k-128k "
                            "context and prefill chunks, as whole modules with their split")] = False,
) -> None:
    """Cases for catalog checkpoints x schemes x TP x M, deduplicated with sources unioned: the per-rank
    cases one GPU of each deployment runs, or with --parallel the whole layers with their split."""
    from operatorx.catalog import CatalogError, CatalogWarning, generate

    _check_output(output)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CatalogWarning)
        try:
            cases = generate(expand_models(models), tp, m, tuple(moe_tokens or ()), scheme, parallel, attention)
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
    from operatorx.catalog import CatalogError, from_config

    _check_output(output)
    try:
        cases = from_config(config, scheme, tp, m)
    except CatalogError as err:
        _fail(str(err))
    _write(cases, output, [])


def serving_cmd(
    model: Annotated[str, typer.Option("--model", help="one catalog checkpoint: its id or its name after the org")],
    isl: Annotated[int, typer.Option("--isl", help="input (prompt) tokens per request")],
    osl: Annotated[int, typer.Option("--osl", help="output tokens per request")],
    conc: Annotated[int, typer.Option("--conc", help="concurrent requests over the whole deployment")],
    output: Annotated[Path, typer.Option("-o", "--output", help="testlist JSON to write")],
    tp: Annotated[int, typer.Option("--tp", help="tensor-parallel size (attention and dense layers)")] = 1,
    dp: Annotated[int, typer.Option("--dp", help="data-parallel attention ranks; each holds conc/dp requests")] = 1,
    ep: Annotated[int, typer.Option("--ep", help="expert-parallel size: 1 or tp·dp")] = 1,
    mtp: Annotated[int, typer.Option("--mtp", help="MTP draft tokens per decode step (each request runs 1+mtp)")] = 0,
    chunk: Annotated[int, typer.Option("--chunk", help="prefill chunk tokens per dp rank (vLLM's "
                                       "max_num_batched_tokens)")] = 8192,
    scheme: Annotated[Optional[str], typer.Option(
        "--scheme", help="the checkpoint's scheme; default its first")] = None,
) -> None:
    """The ops of one decode step and one prefill chunk of a deployment, each with `count` (times per
    step) and `step` (docs/serving.md)."""
    from operatorx.catalog import CatalogError, CatalogWarning
    from operatorx.catalog.serving import Scenario, serving

    _check_output(output)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CatalogWarning)
        try:
            cases = serving(model, Scenario(isl=isl, osl=osl, conc=conc, tp=tp, dp=dp, ep=ep, mtp=mtp, chunk=chunk),
                            scheme)
        except CatalogError as err:
            _fail(str(err))
    _write(cases, output, [w for w in caught if issubclass(w.category, CatalogWarning)])


def register(app: typer.Typer) -> None:
    """Add `generate`, `from-config` and `serving` to the `testlist` sub-app."""
    app.command("generate")(generate_cmd)
    app.command("from-config")(from_config_cmd)
    app.command("serving")(serving_cmd)
