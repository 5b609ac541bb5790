"""The vllm gqa backend: one attention module of vLLM 0.26's own model code, timed over a filled paged cache.

prepare (untimed, build.py): the module support.py names (Qwen3NextAttention / Qwen3Attention /
LlamaAttention) built under the case's cache config, the torch backend's bf16 weights loaded into it,
the attention backend vLLM picked, a KV cache allocated and bound as vLLM's model runner does and
filled with random values for every request's context, the backend's metadata built once from the
layout (batch.py). fn (timed): the module's forward inside vLLM's forward context: q/k/v projection,
norms, RoPE, the cache write of the new tokens, vLLM's attention kernel, the gate, o_proj. check: the
reference requests' rows against the torch backend's fp32 reference (reference.py) on the same
weights, inputs and the cache as vLLM holds it. Importing this package does not import vLLM.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any, Optional

from operatorx.backends.vllm.attention.base import BuiltAttention, Reference, VllmAttentionBackend
from operatorx.backends.vllm.attention.support import module_choice, projection_bound, refusal
from operatorx.spec import Case
from operatorx.spec.attention import GqaArgs
from operatorx.spec.op_type import OpArgs

__all__ = ["VllmGqa", "BOUND"]

#: ||out - ref|| / ||ref||: bf16 cache: the bf16 module's roundings (as the torch backend's bound);
#: fp8 cache: vLLM's FA3 fp8 path also rounds q, the new K/V and the probabilities to e4m3 (about 3.6%
#: rms each, not modelled by the reference, which reads only the cached K/V as stored).
BOUND = {"auto": 2e-2, "bf16": 2e-2, "fp8": 1e-1}


class VllmGqa(VllmAttentionBackend):
    op_type = "gqa"
    CACHE_READ = "cached K/V read back from vLLM's cache through its block table"

    def refusal(self, args: OpArgs) -> Optional[str]:
        return refusal(args)

    def build(self, case: Case, args: GqaArgs, stack: ExitStack) -> BuiltAttention:
        from operatorx.backends.vllm.attention.build import build_gqa

        choice = module_choice(args)
        assert not isinstance(choice, str)
        return build_gqa(case, args, choice, stack)

    def reference(self, args: GqaArgs, built: Any, flavor: str) -> Reference:
        from operatorx.backends.torch.attention.reference import gqa_reference
        from operatorx.backends.vllm.attention.proj import activation

        return gqa_reference(args, built.weights, built.x, built.layout, built.cached, activation(built.plan, flavor))

    def bound(self, args: GqaArgs) -> float:
        return max(BOUND[args.kv_cache_dtype], projection_bound(args))
