"""`gemm` args: out[M, N] = a[M, K] @ b[N, K].T, with operand descriptors."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import PositiveInt, model_validator

from operatorx.spec.base import SpecModel
from operatorx.spec.dtypes import ELEMENT_BITS, OutDType
from operatorx.spec.operand import Operand, check_group
from operatorx.spec.parallel import Parallel

__all__ = ["GemmArgs"]

GemmActivation = Literal["silu", "gelu", "gelu_tanh", "relu"]


class GemmArgs(SpecModel):
    m: PositiveInt
    n: PositiveInt
    k: PositiveInt
    a: Operand
    b: Operand
    out: OutDType = "bf16"
    bias: Optional[Union[bool, OutDType]] = None
    activation: Optional[GemmActivation] = None
    parallel: Optional[Parallel] = None

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
