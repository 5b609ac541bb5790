"""An example `py:` backend: a float GEMM through torch.matmul, checked against the torch backend.

Run it:
    operatorx run -t gemm_perf --device cpu --backend py:docs/examples/user_gemm.py:matmul
    operatorx run -t gemm_perf --backend "py:docs/examples/user_gemm.py:matmul[transpose_b=true]"

docs/user-backends.md explains each step.
"""

from __future__ import annotations

import torch

from operatorx.backends import Unsupported
from operatorx.backends.py_file import gemm_inputs


def matmul(case, device, transpose_b=False):
    """Prepare one case; return the zero-argument call to time.

    Everything here runs once, outside the timed region: refusing what it cannot run, building
    the inputs, laying the weight out.
    """
    if case.type != "gemm":
        raise Unsupported("this example times GEMMs only")
    if case.args.activation is not None:
        raise Unsupported(f"this example has no fused {case.args.activation} epilogue")
    inputs = gemm_inputs(case, device)          # float GEMMs only; raises Unsupported otherwise
    a, b, bias = inputs["a"], inputs["b"], inputs["bias"]     # a [M, K], b [N, K], bias [N] or None
    b_t = b.t().contiguous() if transpose_b else b.t()        # [K, N]: a setting, passed as [transpose_b=true]

    if bias is None:
        return lambda: torch.matmul(a, b_t)
    return lambda: torch.addmm(bias, a, b_t)    # out = bias + a @ b.T, shape [M, N]
