"""Element and scale dtypes of the case format, with their storage widths.

Kept as plain literals and tables (no torch) so the spec validates anywhere.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = [
    "ElementDType",
    "ScaleDType",
    "OutDType",
    "ELEMENT_BITS",
    "SCALE_BITS",
    "FLOAT_DTYPES",
    "QUANT_DTYPES",
]

ElementDType = Literal["bf16", "fp16", "fp32", "e4m3", "e5m2", "e2m1", "int4", "int8"]
ScaleDType = Literal["fp32", "bf16", "fp16", "e4m3", "ue8m0"]
OutDType = Literal["bf16", "fp16", "fp32"]

ELEMENT_BITS: dict[str, int] = {
    "bf16": 16, "fp16": 16, "fp32": 32, "e4m3": 8, "e5m2": 8, "e2m1": 4, "int4": 4, "int8": 8,
}
SCALE_BITS: dict[str, int] = {"fp32": 32, "bf16": 16, "fp16": 16, "e4m3": 8, "ue8m0": 8}

#: Dtypes that carry values directly: a scale on them makes no sense.
FLOAT_DTYPES = frozenset({"bf16", "fp16", "fp32"})
#: Dtypes whose values only mean something together with a scale.
QUANT_DTYPES = frozenset(set(get_args(ElementDType)) - FLOAT_DTYPES)

assert set(ELEMENT_BITS) == set(get_args(ElementDType))
assert set(SCALE_BITS) == set(get_args(ScaleDType))
