"""Upstream's other spellings of a case, read as today's: `moe_layer` and the `quant` slots.

Upstream's `moe_layer` is `moe`, and its newer `moe` spelling names the quantized slots in a
`quant` object: `experts.quant.{x, w13, w2, a2}` and `shared.quant.{x, w13, w2}`. They are the
operand slots `a1`, `w1`, `w2`, `a2` of docs/case-format.md under other names, so a case in either
spelling is the same case (one key, one seed) as the one written in today's.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TYPE_ALIASES", "QUANT_SLOTS", "todays_spelling"]

TYPE_ALIASES = {"moe_layer": "moe"}
#: `quant` slot -> the operand field it is, for the routed and the shared experts.
QUANT_SLOTS = {"experts": {"x": "a1", "w13": "w1", "w2": "w2", "a2": "a2"},
               "shared": {"x": "a1", "w13": "w1", "w2": "w2"}}


def _unfold_quant(part: Any, where: str) -> Any:
    """`{..., "quant": {"x": A, "w13": W}}` -> `{..., "a1": A, "w1": W}`; ValueError naming the field."""
    if not isinstance(part, dict) or "quant" not in part:
        return part
    quant = part["quant"]
    slots = QUANT_SLOTS[where]
    if not isinstance(quant, dict):
        raise ValueError(f"args.{where}.quant: an object of operand descriptors ({', '.join(slots)})")
    out = {k: v for k, v in part.items() if k != "quant"}
    for slot, operand in quant.items():
        if slot not in slots:
            raise ValueError(f"args.{where}.quant.{slot}: not a slot (slots: {', '.join(slots)})")
        field = slots[slot]
        if field in out:
            raise ValueError(f"args.{where}.quant.{slot}: given twice, also as args.{where}.{field}")
        out[field] = operand
    return out


def todays_spelling(data: dict[str, Any]) -> dict[str, Any]:
    """A case's JSON in today's spelling (a new dict when anything changed, else the same one)."""
    kind = data.get("type")
    args = data.get("args")
    if kind not in TYPE_ALIASES and not (kind == "moe" and isinstance(args, dict)
                                         and any(isinstance(args.get(p), dict) and "quant" in args[p]
                                                 for p in QUANT_SLOTS)):
        return data
    data = {**data, "type": TYPE_ALIASES.get(kind, kind)}     # type: ignore[arg-type]
    if isinstance(args, dict):
        data["args"] = {k: (_unfold_quant(v, k) if k in QUANT_SLOTS else v) for k, v in args.items()}
    return data
