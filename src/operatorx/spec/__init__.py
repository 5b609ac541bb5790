"""What a case is: dtypes, operands, gemm/moe args, testlists. Imports no torch."""

from operatorx.spec.case import Case
from operatorx.spec.gemm import GemmArgs
from operatorx.spec.moe import MoeArgs
from operatorx.spec.operand import Operand, Scale
from operatorx.spec.testlist import (
    TestlistError,
    TestlistWarning,
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
