"""Operand descriptors: an element dtype, its scales, and the dtype it arrives in."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Annotated, Any, Optional

from pydantic import Field, ModelWrapValidatorHandler, model_validator
from typing_extensions import Self

from operatorx.spec.base import MAX_INT64, SpecModel
from operatorx.spec.dtypes import ELEMENT_BITS, FLOAT_DTYPES, SCALE_BITS, ElementDType, ScaleDType

__all__ = ["Scale", "Operand", "GroupSize", "check_group"]

#: One side of a scale group: -1 spans the whole dimension, else a positive size.
GroupSize = Annotated[int, Field(ge=-1, le=MAX_INT64)]


class Scale(SpecModel):
    """How an operand is scaled: `group` = [rows, cols] of elements sharing one scale."""

    dtype: ScaleDType
    static: bool
    group: Annotated[list[GroupSize], Field(min_length=2, max_length=2)]

    @model_validator(mode="after")
    def _no_zero_group(self) -> Scale:
        if 0 in self.group:
            raise ValueError(f"group {list(self.group)}: sizes are -1 (whole dimension) or positive, not 0")
        return self

    def oriented(self, weight: bool) -> tuple[int, int]:
        """The group as [rows, cols] of the stored operand ([M, K] activation, [N, K] weight).

        The format writes per-channel weight scales as [-1, 1] ("per row of the weight"):
        one scale per output channel, which in the [N, K] layout is [1, -1].
        """
        if weight and tuple(self.group) == (-1, 1):
            return (1, -1)
        return (self.group[0], self.group[1])

    def block(self, rows: int, cols: int, weight: bool) -> tuple[int, int]:
        """The concrete block size [r, c] for a [rows, cols] operand (-1 resolved)."""
        r, c = self.oriented(weight)
        return (rows if r == -1 else r, cols if c == -1 else c)

    def count(self, rows: int, cols: int, weight: bool) -> int:
        """Number of scale values for a [rows, cols] operand (partial blocks round up)."""
        r, c = self.block(rows, cols, weight)
        return -(-rows // r) * -(-cols // c)

    @property
    def kind(self) -> str:
        """A short name for the layout: tensor, row, col, group or block."""
        r, c = self.group
        if (r, c) == (-1, -1):
            return "tensor"
        if r == 1 and c == -1:
            return "row"
        if r == -1 and c == 1:
            return "channel"
        if r == 1:
            return f"1x{c}"
        return f"{r}x{c}" if c != -1 else f"{r}x-1"


#: Operands already validated, by the text of the JSON they were read from (see Operand._interned).
_INTERNED: dict[str, Operand] = {}
#: The most distinct operands kept: real testlists use a few dozen; past this, new ones are not kept.
_INTERNED_MAX = 4096
#: Longer descriptions are validated every time (no real operand is this long).
_INTERN_KEY_MAX_CHARS = 400
#: Set while `Operand.__init__` validates: that validation keeps its own instance.
_BUILDING: ContextVar[bool] = ContextVar("operatorx_operand_building", default=False)


class Operand(SpecModel):
    """One matrix operand of an op (see the format page, "Operand descriptor")."""

    dtype: ElementDType
    scale: Optional[Scale] = None
    scale2: Optional[Scale] = None
    symmetric: Optional[bool] = None
    input: Optional[ElementDType] = None

    def __init__(self, /, **data: Any) -> None:
        """`Operand(dtype=...)` builds its own instance: validation through `__init__` must return
        `self`, so it is never swapped for an interned one (pydantic warns where it would be)."""
        token = _BUILDING.set(True)
        try:
            super().__init__(**data)
        finally:
            _BUILDING.reset(token)

    @model_validator(mode="wrap")
    @classmethod
    def _interned(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        """One frozen instance per distinct description: a testlist repeats a handful of operands over
        every case, and sharing them halved the memory of 10^5 loaded cases (docs/benchmarks.md, "Scale
        of a testlist"). The description's `repr` is the key: it tells `1` from `1.0` and `true`, as
        strict validation does."""
        if type(data) is not dict or _BUILDING.get():
            return handler(data)._consistent()
        key = repr(data)
        hit = _INTERNED.get(key)
        if isinstance(hit, cls):
            return hit
        out = handler(data)._consistent()
        if len(_INTERNED) < _INTERNED_MAX and len(key) <= _INTERN_KEY_MAX_CHARS:
            _INTERNED[key] = out
        return out

    def _consistent(self) -> Self:
        """The fields agree (a scale where the dtype needs one, none where it does not); checked once
        per distinct operand, inside `_interned`."""
        if self.dtype in FLOAT_DTYPES and (self.scale or self.scale2):
            raise ValueError(f"a {self.dtype} operand carries its values directly and takes no scale")
        if self.dtype not in FLOAT_DTYPES and self.scale is None:
            raise ValueError(f"a {self.dtype} operand needs a scale")
        if self.scale2 is not None and self.scale is None:
            raise ValueError("scale2 is a second-level scale and needs a scale")
        if self.symmetric is not None and not self.dtype.startswith("int"):
            raise ValueError(f"symmetric applies to integer dtypes, not {self.dtype}")
        return self

    def arrives_as(self, activation: bool) -> str:
        """The dtype the operand is handed to the op in.

        Quantized activations arrive in bf16 unless `input` says otherwise (the format's default);
        weights arrive already in their storage dtype, unless their scale is dynamic. A float
        operand arrives as itself.
        """
        if self.input is not None:
            return self.input
        if self.dtype in FLOAT_DTYPES:
            return self.dtype
        dynamic = self.scale is not None and not self.scale.static
        return "bf16" if activation or dynamic else self.dtype

    def quantized_in_op(self, activation: bool) -> bool:
        """True when quantizing this operand (a cast, and the scale when it is dynamic) is timed."""
        return self.arrives_as(activation) != self.dtype

    def bytes(self, rows: int, cols: int, weight: bool) -> int:
        """Bytes of the stored operand: elements plus every scale, rounded up to whole bytes."""
        total_bits = rows * cols * ELEMENT_BITS[self.dtype]
        for s in (self.scale, self.scale2):
            if s is not None:
                total_bits += s.count(rows, cols, weight) * SCALE_BITS[s.dtype]
        return -(-total_bits // 8)

    def scheme_name(self) -> str:
        """e.g. `bf16`, `e4m3/fp32:1x128:dyn`."""
        if self.scale is None:
            return self.dtype
        s = self.scale
        name = f"{self.dtype}/{s.dtype}:{s.kind}{'' if s.static else ':dyn'}"
        if self.scale2 is not None:
            name += f"+{self.scale2.dtype}:{self.scale2.kind}"
        return name


def check_group(operand: Operand, dims: tuple[str, int, str, int], what: str, weight: bool = False) -> None:
    """Refuse a scale group that does not tile the operand; `dims` = (row name, rows, col name, cols).

    The contraction (cols) side must divide exactly: every kernel reads whole groups along K.
    A weight's row blocks may end partial: DeepSeek's kv_a_proj (N=576) carries
    ceil(576/128) row blocks in its checkpoint.
    """
    row_name, rows, col_name, cols = dims
    for slot in ("scale", "scale2"):
        scale = getattr(operand, slot)
        if scale is None:
            continue
        r, c = scale.oriented(weight)
        if c != -1 and cols % c:
            raise ValueError(f"{what}.{slot}.group {list(scale.group)} does not divide {col_name}={cols}")
        if r != -1 and rows % r and not weight:
            raise ValueError(f"{what}.{slot}.group {list(scale.group)} does not divide {row_name}={rows}")
