"""The vllm gdn and kda backends: one linear-attention module of vLLM 0.26's own code, timed over filled states.

Not registered in backends/names.py until its gpu tests pass on an H200.

prepare (untimed, linear_build.py): the module linear_support names (QwenGatedDeltaNetAttention /
KimiGatedDeltaNetAttention) built under the case's cache config, random bf16 weights loaded into it, its
MambaSpec's conv and recurrent states allocated and bound as vLLM's runner does, random format-valid
states for every request with a context, the GDN backend's metadata built once (decodes first). fn
(timed): the module's forward inside vLLM's forward context: projections, causal conv (prefill:
causal_conv1d_fn; decode: causal_conv1d_update), gates, the delta rule (prefill: the chunked kernel from
the request's state where ctx > 0; decode: the recurrent one), the gated RMSNorm, out_proj; the states
are updated in place as in serving. check: the states restored to their filled values, one call, then
the reference requests' output rows and their states after the call against linear_reference.py's fp32
token-by-token module on the same weights, inputs and states. Importing this module does not import vLLM.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, Optional, Union

from operatorx.backends.base import Check
from operatorx.backends.vllm.attention.base import VllmAttentionBackend
from operatorx.backends.vllm.attention.linear_support import linear_refusal
from operatorx.spec import Case
from operatorx.spec.attention import GdnArgs, KdaArgs
from operatorx.spec.op_type import OpArgs

if TYPE_CHECKING:
    from operatorx.backends.vllm.attention.linear_build import BuiltLinear

__all__ = ["VllmGdn", "VllmKda", "LINEAR_BOUND", "check_linear"]

#: ||out - ref|| / ||ref|| (and the same for the states after the call): the bf16 module's roundings, as the
#: gqa bound: projections, conv output and q/k/v in bf16, the chunked prefill's per-chunk states and WY
#: factors in bf16, the core output and the gated norm in bf16, out_proj. A bf16 recurrent state adds none
#: to one call's output (every kernel loads it into fp32 registers); its write-back rounds the state after the
#: call by bf16's half ulp, well inside the bound.
LINEAR_BOUND = 2e-2


def check_linear(args: Union[GdnArgs, KdaArgs], b: BuiltLinear, fn: Any) -> Check:
    """Restore the filled states, run `fn` once, compare output rows and final states with the reference."""
    import torch

    from operatorx.backends.check import rel_error
    from operatorx.backends.torch.attention.linear_reference import linear_reference

    b.restore()
    out = b.in_layout_order(fn())
    torch.cuda.synchronize()
    ref = linear_reference(args, b.weights, b.x, b.layout, b.state)
    out_error = rel_error(out[ref.rows.to(out.device)], ref.out)
    after = [b.state(r, filled=False) for r in ref.requests]
    ssm = rel_error(torch.cat([s.ssm.float().flatten() for s in after]),
                    torch.cat([s.ssm.flatten() for s in ref.final]))
    conv = rel_error(torch.cat([s.conv.float().flatten() for s in after]),
                     torch.cat([s.conv.flatten() for s in ref.final]))
    graph = "; output of the CUDA-graph replay" if b.graph is not None else ""
    return Check(max(out_error, ssm, conv), LINEAR_BOUND, int(ref.rows.numel()),
                 f"{ref.what}; states read back from vLLM's state tensors through the slots; output rel error "
                 f"{out_error:.3g}, recurrent state after the call {ssm:.3g}, conv state {conv:.3g}{graph}")


class _VllmLinear(VllmAttentionBackend):
    """gdn and kda: their own refusal, build and check (output and the states after the call)."""

    def refusal(self, args: OpArgs) -> Optional[str]:
        return linear_refusal(args)

    def build(self, case: Case, args: Any, stack: ExitStack) -> BuiltLinear:
        from operatorx.backends.vllm.attention.linear_build import build_linear

        assert isinstance(args, (GdnArgs, KdaArgs))
        return build_linear(case, args, stack)

    def check(self, args: Any, b: Any, fn: Any) -> Check:
        return check_linear(args, b, fn)


class VllmGdn(_VllmLinear):
    op_type = "gdn"


class VllmKda(_VllmLinear):
    op_type = "kda"
