"""The shipped checkpoints: one data file each under catalog/checkpoints/, facts kept verbatim.

A data file holds `config` (config.json keys as the checkpoint publishes them, only those
confirmed), `implementation` (facts its reference code fixes and config.json does not say),
`facts_from` (where each came from), `tp` (the tensor-parallel sizes it is deployed at) and
`schemes` (per-role quantization of each published variant). `not_produced` names GEMM role
groups (gemm_roles.ROLE_GROUPS) the catalog leaves out on purpose, each with its reason: a
group whose facts were not found for this model is declared there rather than left to warn.
Nothing here computes shapes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from operatorx.catalog.arch import Arch, read_arch
from operatorx.catalog.errors import CatalogError
from operatorx.catalog.gemm_roles import ROLE_GROUPS
from operatorx.catalog.implementations import implementation_for
from operatorx.catalog.moe_layer import gate_dtype_of
from operatorx.catalog.schemes import RoleSchemes, role_schemes

__all__ = ["Checkpoint", "load_catalog", "find_checkpoints"]

_REQUIRED = ("id", "family", "facts_from", "config", "tp", "schemes")
_ALLOWED = set(_REQUIRED) | {"implementation", "implementation_from", "notes", "moe_routing_sweep", "not_produced"}


@dataclass(frozen=True)
class Checkpoint:
    id: str
    family: str
    facts_from: tuple[str, ...]
    tps: tuple[int, ...]
    arch: Arch
    schemes: dict[str, RoleSchemes]
    scheme_checkpoints: dict[str, str]
    moe_routing_sweep: bool = False
    #: Names of the GEMM role groups left out on purpose, never produced for this checkpoint. Only the
    #: names: each one's reason stays in the data file's `not_produced` map, where parsing requires it.
    not_produced: tuple[str, ...] = ()

    def source_id(self, scheme: str) -> str:
        """The checkpoint id a scheme's cases cite (a quantized variant may be its own repo)."""
        return self.scheme_checkpoints.get(scheme, self.id)


def _parse(data: dict[str, Any], where: str) -> Checkpoint:
    missing = [k for k in _REQUIRED if k not in data]
    extra = [k for k in data if k not in _ALLOWED]
    if missing or extra:
        raise CatalogError(f"{where}: missing keys {missing}, unknown keys {extra}")
    tps = tuple(data["tp"])
    if not tps or any(t not in (1, 2, 4, 8) for t in tps):
        raise CatalogError(f"{where}: tp must list sizes from 1, 2, 4, 8; got {list(tps)}")
    config = data["config"]
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    impl = {**implementation_for(text.get("model_type")), **data.get("implementation", {})}
    arch = read_arch(config, data["id"], impl)
    schemes, variants = {}, {}
    gate = gate_dtype_of(arch) if arch.is_moe else None
    for name, spec in data["schemes"].items():
        schemes[name] = role_schemes(name, spec, where)
        if "checkpoint" in spec:
            variants[name] = spec["checkpoint"]
        router = schemes[name]["router"].name
        if gate is not None and router != gate:
            raise CatalogError(f"{where}: scheme '{name}' runs the router gate GEMM as '{router}' but the MoE "
                               f"layer's gate is {gate} (implementation gate_dtype); make them agree")
    skip = data.get("not_produced", {})
    if not isinstance(skip, dict) or any(g not in ROLE_GROUPS or not isinstance(r, str) or not r.strip()
                                         for g, r in skip.items()):
        raise CatalogError(f"{where}: not_produced maps role groups ({', '.join(ROLE_GROUPS)}) to the reason "
                           f"each is left out; got {skip!r}")
    return Checkpoint(id=data["id"], family=data["family"], facts_from=tuple(data["facts_from"]), tps=tps,
                      arch=arch, schemes=schemes, scheme_checkpoints=variants,
                      moe_routing_sweep=bool(data.get("moe_routing_sweep", False)), not_produced=tuple(skip))


@cache
def load_catalog() -> tuple[Checkpoint, ...]:
    """Every shipped checkpoint, sorted by file name so generation order is stable."""
    root = resources.files("operatorx.catalog") / "checkpoints"
    files = sorted((p for p in root.iterdir() if p.name.endswith(".json")), key=lambda p: p.name)
    out = []
    for path in files:
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise CatalogError(f"{path.name}: not JSON: line {err.lineno}: {err.msg}") from err
        out.append(_parse(data, path.name))
    ids = [c.id for c in out]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise CatalogError(f"checkpoint ids listed twice: {dupes}")
    return tuple(out)


def find_checkpoints(names: list[str] | None) -> list[Checkpoint]:
    """Checkpoints by id, by the part after the org, or by family; None means all."""
    catalog = load_catalog()
    if not names:
        return list(catalog)
    picked: list[Checkpoint] = []
    for name in names:
        low = name.lower()
        hits = [c for c in catalog if low in (c.id.lower(), c.id.split("/")[-1].lower(), c.family.lower())]
        if not hits:
            known = ", ".join(c.id for c in catalog)
            raise CatalogError(f"unknown model '{name}'; the catalog has: {known}")
        picked += [c for c in hits if c not in picked]
    return picked
