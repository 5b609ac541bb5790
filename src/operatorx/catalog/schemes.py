"""Quantization schemes: named operand pairs (schemes.json) and a checkpoint's choice per role.

A checkpoint data file says, per scheme it ships in, which preset each role runs:
`{"default": "fp8_block", "roles": {"router": "bf16", "lm_head": "bf16"}}`. Roles are the
issue's list: attention qkv, attention output, dense MLP, routed experts, shared experts,
router and lm_head, plus `linear_attn_ba`: the gated-delta-net `in_proj_ba` (beta/alpha
state gates), its own role because Qwen3.5's FP8 release keeps it bf16 while quantizing
`in_proj_qkvz`; a scheme that does not name it runs it like `attn_qkv`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from operatorx.catalog.errors import CatalogError

__all__ = ["ROLES", "Scheme", "presets", "RoleSchemes", "role_schemes"]

ROLES = ("attn_qkv", "attn_out", "dense_mlp", "experts", "shared_experts", "router", "lm_head", "linear_attn_ba")


@dataclass(frozen=True)
class Scheme:
    """A named pair of operand descriptors (plain dicts in the case format)."""

    name: str
    a: dict[str, Any]
    b: dict[str, Any]


@cache
def presets() -> dict[str, Scheme]:
    text = (resources.files("operatorx.catalog") / "schemes.json").read_text()
    data = json.loads(text)
    return {name: Scheme(name, body["a"], body["b"]) for name, body in data.items() if not name.startswith("_")}


def preset(name: str, where: str) -> Scheme:
    try:
        return presets()[name]
    except KeyError:
        raise CatalogError(f"unknown scheme '{name}' ({where}); known: {', '.join(sorted(presets()))}") from None


@dataclass(frozen=True)
class RoleSchemes:
    """The scheme of every role for one (checkpoint, scheme name)."""

    name: str
    by_role: dict[str, Scheme]

    def __getitem__(self, role: str) -> Scheme:
        return self.by_role[role]


def role_schemes(name: str, spec: dict[str, Any], where: str) -> RoleSchemes:
    """Resolve `{"default": preset, "roles": {role: preset}}`; unknown roles or presets are errors."""
    if "default" not in spec:
        raise CatalogError(f"scheme '{name}' has no 'default' preset ({where})")
    overrides = spec.get("roles", {})
    bad = [r for r in overrides if r not in ROLES]
    if bad:
        raise CatalogError(f"scheme '{name}': unknown roles {bad}; roles are {', '.join(ROLES)} ({where})")
    default = preset(spec["default"], where)
    by_role = {r: preset(overrides[r], where) if r in overrides else default for r in ROLES}
    if "linear_attn_ba" not in overrides:  # an attention input projection: follows attn_qkv unless named
        by_role["linear_attn_ba"] = by_role["attn_qkv"]
    return RoleSchemes(name, by_role)
