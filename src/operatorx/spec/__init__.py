"""What a case is: dtypes, operands, gemm/moe args, testlists. Imports no torch.

The names load on first use (`operatorx.lazy`); the testlist errors (`operatorx.spec.errors`) load
without the case models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from operatorx.lazy import lazy_names
from operatorx.spec.errors import TestlistError, TestlistWarning

if TYPE_CHECKING:
    from operatorx.spec.case import Case
    from operatorx.spec.gemm import GemmArgs
    from operatorx.spec.moe import MoeArgs
    from operatorx.spec.operand import Operand, Scale
    from operatorx.spec.testlist import (
        dump_testlist,
        load_testlist,
        merge_cases,
        parse_cases,
        resolve_testlist,
        shipped_testlists,
    )

__all__ = [
    "Case", "GemmArgs", "MoeArgs", "Operand", "Scale", "TestlistError", "TestlistWarning", "dump_testlist",
    "load_testlist", "merge_cases", "parse_cases", "resolve_testlist", "shipped_testlists",
]

_HOME = {"Case": "operatorx.spec.case", "GemmArgs": "operatorx.spec.gemm", "MoeArgs": "operatorx.spec.moe",
         "Operand": "operatorx.spec.operand", "Scale": "operatorx.spec.operand",
         **{name: "operatorx.spec.testlist" for name in ("dump_testlist", "load_testlist", "merge_cases",
                                                          "parse_cases", "resolve_testlist", "shipped_testlists")}}

__getattr__ = lazy_names(__name__, _HOME)
