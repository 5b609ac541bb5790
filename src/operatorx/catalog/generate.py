"""Checkpoints (or a user's config.json) → cases with sources.

`generate` walks the catalog: every checkpoint x scheme x TP x M for GEMMs, plus MoE layers
at the token counts asked for, as the per-rank cases one GPU of a deployment runs (no
`parallel`; `metadata.deployment` says where they come from) or, with `parallel`, as whole
layers with their split (upstream's meaning of `parallel`, docs/case-format.md). A role whose
facts the catalog does not hold is skipped with a CatalogWarning naming the field. `from_config`
reads one config.json offline and is strict: any missing field is an error, because the user can
fix their file.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from operatorx.catalog.arch import Arch, read_arch
from operatorx.catalog.attention_cases import DECODE_BATCH, DECODE_CTX, PREFILL_CHUNKS, attention_cases
from operatorx.catalog.checkpoints import Checkpoint, find_checkpoints
from operatorx.catalog.errors import CatalogError, CatalogWarning, MissingField
from operatorx.catalog.gemm_roles import gemm_shapes, mlp_prefix
from operatorx.catalog.implementations import implementation_for
from operatorx.catalog.moe_layer import experts_inter, gate_dtype_of, moe_args
from operatorx.catalog.schemes import ROLES, RoleSchemes, preset
from operatorx.spec import Case, merge_cases

__all__ = ["DECODE_M", "PREFILL_M", "MOE_TOKENS", "generate", "from_config", "gemm_cases", "moe_cases"]

DECODE_M = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PREFILL_M = (512, 1024, 2048, 4096, 8192, 16384, 32768)
MOE_TOKENS = (1, 8, 64, 512, 2048)
VALID_TP = (1, 2, 4, 8)


def _case(kind: str, args: dict[str, Any], source: str, notes: list[str], tp: int) -> Case | None:
    """A per-rank case (no `parallel`; the deployment it comes from in `metadata`) or, when `args` holds
    a `parallel`, a whole layer with its split."""
    data: dict[str, Any] = {"type": kind, "args": args, "sources": [source]}
    if "parallel" not in args:
        data["metadata"] = {"deployment": {"tp": [tp]}}
    try:
        return Case.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        notes.append(f"{source}: case not produced: {'.'.join(map(str, first['loc']))}: {first['msg']}")
        return None


def gemm_cases(arch: Arch, schemes: RoleSchemes, source_id: str, tp: int, ms: Sequence[int],
               strict: bool, notes: list[str], leave_out: tuple[str, ...] = (), parallel: bool = False) -> list[Case]:
    """GEMM cases of one checkpoint scheme at one TP, one per (role, M); `leave_out` names role
    groups the checkpoint declares not produced.

    By default each case is the GEMM one rank runs at `tp` (single-device, no `parallel`). With
    `parallel`, each is the whole layer with `parallel: {tp}` (upstream's *_parallel lists), for the
    roles whose split `tp` divides.
    """
    out = []
    rank_shapes = gemm_shapes(arch, tp, strict, notes, leave_out)
    if parallel:
        at_tp = {s.role for s in rank_shapes}
        rank_shapes = [s for s in gemm_shapes(arch, 1, strict, notes, leave_out) if s.role in at_tp]
    for shape in rank_shapes:
        scheme = preset(shape.preset, shape.role) if shape.preset else schemes[shape.scheme_role]
        out_dtype = "fp32" if scheme.a.get("dtype") == "fp32" else shape.out
        for m in ms:
            args: dict[str, Any] = {"m": m, "n": shape.n, "k": shape.k, "a": scheme.a, "b": scheme.b,
                                    "out": out_dtype}
            if shape.bias:
                args["bias"] = True
            if parallel and tp > 1:
                args["parallel"] = {"tp": tp}
            case = _case("gemm", args, f"{source_id}/{shape.role}", notes, tp)
            if case is not None:
                out.append(case)
    return out


def moe_cases(arch: Arch, schemes: RoleSchemes, source_id: str, tp: int, tokens: Iterable[int],
              strict: bool, notes: list[str], distributions: Sequence[Any] = ("natural",),
              parallel: bool = False) -> list[Case]:
    """MoE layer cases of one checkpoint scheme at one TP; empty for dense models.

    By default each case is the layer one rank runs at `tp` (experts' intermediate sizes split);
    with `parallel`, the whole layer with `parallel: {tp}`. A checkpoint with `num_hash_layers`
    (DeepSeek-V4) also gets its hash-routed layers, cited as `<prefix>.experts:hash`. When vLLM pads
    the per-rank expert intermediate size (MXFP4 experts, see moe_layer), a per-rank case runs the
    padded size and its role says `<prefix>.experts:padded-from-<per-rank size>`.
    """
    if not arch.is_moe:
        return []
    out: list[Case] = []
    kinds = [False] + ([True] if arch.opt("num_hash_layers") else [])
    prefix = mlp_prefix(arch)
    for t in tokens:
        for dist in distributions:
            for hashed in kinds:
                try:
                    run_inter, inter = experts_inter(arch, schemes["experts"], tp)
                    args = moe_args(arch, schemes["experts"], schemes["shared_experts"], 1 if parallel else tp, t,
                                    dist, hash_routed=hashed)
                    if parallel:
                        moe_args(arch, schemes["experts"], schemes["shared_experts"], tp, t, dist, hash_routed=hashed)
                except MissingField as err:
                    if strict:
                        raise
                    notes.append(f"{arch.origin}: MoE layer not produced: {err}")
                    return out
                role = f"{prefix}.experts:hash" if hashed else f"{prefix}.experts"
                if parallel and tp > 1:
                    args["parallel"] = {"tp": tp}
                elif not parallel and run_inter != inter:  # vLLM pads the per-rank intermediate size; say so
                    role += f":padded-from-{inter}"
                case = _case("moe", args, f"{source_id}/{role}", notes, tp)
                if case is not None:
                    out.append(case)
    return out


def _check_tps(tps: Iterable[int]) -> None:
    bad = [t for t in tps if t not in VALID_TP]
    if bad:
        raise CatalogError(f"tp must be one of {VALID_TP}; got {bad}")


def _warn(notes: list[str]) -> None:
    for line in dict.fromkeys(notes):
        warnings.warn(line, CatalogWarning, stacklevel=3)


def _tps_for(ckpt: Checkpoint, tps: Sequence[int] | None) -> tuple[int, ...]:
    return tuple(tps) if tps else ckpt.tps


def generate(models: Sequence[str] | None = None, tps: Sequence[int] | None = None,
             ms: Sequence[int] | None = None, moe_tokens: Sequence[int] = (),
             schemes: Sequence[str] | None = None, parallel: bool = False, attention: bool = False) -> list[Case]:
    """Cases for catalog checkpoints (all when `models` is empty), merged with sources unioned.

    Per-rank single-device cases by default (the deployment in `metadata.deployment`); with
    `parallel`, whole layers with `parallel: {tp}` (TP 1 adds nothing there and is left out).

    tps: TP sizes to use (default: each checkpoint's deployed sizes). ms: GEMM M values
    (default DECODE_M + PREFILL_M). moe_tokens: MoE layer token counts (default none).
    schemes: restrict to these scheme names (default: every scheme a checkpoint ships).
    attention: add each checkpoint's attention module at every TP over the decode and prefill
    batches of catalog/attention_cases.py (whole modules: `parallel: {tp}` above TP 1).
    """
    _check_tps(tps or ())
    ms = tuple(ms) if ms else DECODE_M + PREFILL_M
    if any(m <= 0 for m in ms):
        raise CatalogError(f"m must be positive; got {list(ms)}")
    notes: list[str] = []
    cases: list[Case] = []
    for ckpt in find_checkpoints(list(models) if models else None):
        for name, role_map in ckpt.schemes.items():
            if schemes and name not in schemes:
                continue
            for tp in _tps_for(ckpt, tps):
                if parallel and tp == 1:
                    continue
                cases += gemm_cases(ckpt.arch, role_map, ckpt.source_id(name), tp, ms, False, notes,
                                    ckpt.not_produced, parallel)
                cases += moe_cases(ckpt.arch, role_map, ckpt.source_id(name), tp, moe_tokens, False, notes,
                                   parallel=parallel)
                if attention:
                    decode = [(b, c) for b in DECODE_BATCH for c in DECODE_CTX]
                    cases += attention_cases(ckpt.arch, role_map, ckpt.source_id(name), tp, notes, decode,
                                             PREFILL_CHUNKS)
    _warn(notes)
    return merge_cases(cases)


def from_config(path: str | Path, scheme: str, tp: int, ms: Sequence[int] | None = None,
                moe_tokens: Sequence[int] = MOE_TOKENS) -> list[Case]:
    """Cases for a user's config.json read offline, every role in `scheme` except the router
    gate (in the dtype the model's implementation runs it: bf16 unless the implementation
    table says fp32) and lm_head (bf16), which vLLM builds unquantized. Strict: gaps are errors."""
    _check_tps([tp])
    path = Path(path)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise CatalogError(f"{path}: cannot read: {err.strerror or err}") from err
    except UnicodeDecodeError as err:
        raise CatalogError(f"{path}: not UTF-8 text (byte {err.start})") from err
    except json.JSONDecodeError as err:
        raise CatalogError(f"{path}: not JSON: line {err.lineno}: {err.msg}") from err
    if not isinstance(config, dict):
        raise CatalogError(f"{path}: a config.json is a JSON object, got {type(config).__name__}")
    chosen = preset(scheme, "--scheme")
    bf16 = preset("bf16", "--scheme")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    arch = read_arch(config, str(path), implementation_for(text.get("model_type") if isinstance(text, dict) else None))
    router = preset(gate_dtype_of(arch), "router gate dtype")
    role_map = RoleSchemes(scheme, {r: router if r == "router" else bf16 if r == "lm_head" else chosen
                                    for r in ROLES})
    name = config.get("_name_or_path") or path.parent.name or path.stem
    notes: list[str] = []
    cases = gemm_cases(arch, role_map, str(name), tp, tuple(ms) if ms else DECODE_M + PREFILL_M, True, notes)
    cases += moe_cases(arch, role_map, str(name), tp, moe_tokens, True, notes)
    if notes:
        raise CatalogError("\n".join(notes))
    return merge_cases(cases)
