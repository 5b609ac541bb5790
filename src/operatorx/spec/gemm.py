"""`gemm` args: out[M, N] = a[M, K] @ b[N, K].T, with operand descriptors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Optional, Union

from pydantic import field_validator, model_validator

from operatorx.spec.base import Size
from operatorx.spec.dtypes import ELEMENT_BITS, OutDType
from operatorx.spec.op_type import OpArgs
from operatorx.spec.operand import Operand, check_group
from operatorx.spec.parallel import Parallel, check_family_axes
from operatorx.spec.shard import (
    NO_LAYER_SHAPES,
    VOCAB_PADDING,
    GemmSplit,
    LayerShapes,
    ShardRefused,
    divide,
    split_of_role,
)

__all__ = ["GemmArgs"]

GemmActivation = Literal["silu", "gelu", "gelu_tanh", "relu"]


class GemmArgs(OpArgs):
    """out[M, N] = a[M, K] @ b[N, K].T of the whole layer; `parallel.tp` splits it over tp ranks."""

    FAMILY = "gemm"
    SIZE_AXIS = "m"

    m: Size
    n: Size
    k: Size
    a: Operand
    b: Operand
    out: OutDType = "bf16"
    bias: Optional[Union[bool, OutDType]] = None
    activation: Optional[GemmActivation] = None
    parallel: Optional[Parallel] = None

    @field_validator("parallel")
    @classmethod
    def _gemm_axes(cls, parallel: Optional[Parallel]) -> Optional[Parallel]:
        return check_family_axes(parallel, "gemm")

    @model_validator(mode="after")
    def _groups_tile(self) -> GemmArgs:
        check_group(self.a, ("M", self.m, "K", self.k), "a")
        check_group(self.b, ("N", self.n, "K", self.k), "b", weight=True)
        return self

    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def min_bytes(self) -> int:
        """Fewest bytes the op must move: each operand read once as it arrives, the output written once.

        An activation quantized inside the op is read in the dtype it arrives in.
        """
        if self.a.quantized_in_op(activation=True):
            a_bytes = self.m * self.k * ELEMENT_BITS[self.a.arrives_as(activation=True)] // 8
        else:
            a_bytes = self.a.bytes(self.m, self.k, weight=False)
        b_bytes = self.b.bytes(self.n, self.k, weight=True)
        out_bytes = self.m * self.n * ELEMENT_BITS[self.out] // 8
        bias_dtype = self.bias if isinstance(self.bias, str) else self.out
        bias_bytes = self.n * ELEMENT_BITS[bias_dtype] // 8 if self.bias else 0
        return a_bytes + b_bytes + out_bytes + bias_bytes

    def scheme(self) -> str:
        """Short scheme label: `bf16`, or `a=<..> b=<..>` when quantized."""
        a, b = self.a.scheme_name(), self.b.scheme_name()
        return a if a == b and self.a.scale is None else f"a={a} b={b}"

    def label(self) -> str:
        return f"gemm {self.m}x{self.n}x{self.k}{self.split_label()}"

    def size(self) -> int:
        return self.m

    def family(self) -> str:
        return f"gemm Mx{self.n}x{self.k}{self.split_label()}"

    def peak_dtypes(self) -> tuple[str, str]:
        return self.a.dtype, self.b.dtype

    def rank_shard(self, sources: Sequence[str],
                   shapes: LayerShapes = NO_LAYER_SHAPES) -> tuple[GemmArgs, str]:
        """(the GEMM one tp rank runs, the rule), split as the sources' role says (spec/shard.py);
        ShardRefused when no role says, or the roles disagree."""
        tp = self.parallel.tp if self.parallel is not None else 1
        if not sources:
            raise ShardRefused("no sources: the layer's role decides how a tp GEMM splits, and this case names none")
        splits: dict[GemmSplit, str] = {}
        for source in sources:
            role = source.rpartition("/")[2]
            kind = split_of_role(role)
            if kind is None:
                raise ShardRefused(f"role {role!r} ({source}): no split rule for it (column, row, vocab, replicated)")
            splits.setdefault(kind, source)
        if len(splits) > 1:
            said = ", ".join(f"{k} ({s})" for k, s in splits.items())
            raise ShardRefused(f"the sources disagree on the split: {said}")
        ((split, source),) = splits.items()
        exact = shapes.rank_shape(source, tp, (self.n, self.k))
        n, k = exact if exact is not None else (self.n, self.k)
        if exact is None and split == "column":
            n = divide(self.n, tp, "n")
        elif exact is None and split == "row":
            k = divide(self.k, tp, "k")
        elif exact is None and split == "vocab":
            n = divide(-(-self.n // VOCAB_PADDING) * VOCAB_PADDING, tp, f"n padded to {VOCAB_PADDING}")
        moved = [f"{name} {full} -> {part}" for name, full, part in (("n", self.n, n), ("k", self.k, k))
                 if full != part]
        how = ", ".join(moved) if moved else "every rank runs the whole GEMM"
        rule = f"{split}-parallel" if split != "replicated" else "replicated"
        rule += f" by role {source.rpartition('/')[2]}: {how}"
        if exact is not None:
            rule += " (the catalog's layer)"
        data = {**self.model_dump(mode="json", exclude_none=True), "n": n, "k": k}
        data.pop("parallel", None)
        try:
            return GemmArgs.model_validate(data), rule
        except ValueError as err:   # e.g. a K block scale that the shard's K no longer tiles
            raise ShardRefused(f"the shard ({rule}) is not a valid GEMM: {err}") from err
