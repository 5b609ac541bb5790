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

import gc
from typing import Any, Optional

from operatorx.backends.base import Check, Prepared, Unsupported
from operatorx.backends.vllm.attention.support import module_choice, refusal
from operatorx.spec import Case
from operatorx.spec.attention import GqaArgs

__all__ = ["VllmGqa", "BOUND"]

#: ||out - ref|| / ||ref||: bf16 cache: the bf16 module's roundings (as the torch backend's bound);
#: fp8 cache: vLLM's FA3 fp8 path also rounds q, the new K/V and the probabilities to e4m3 (about 3.6%
#: rms each, not modelled by the reference, which reads only the cached K/V as stored).
BOUND = {"auto": 2e-2, "bf16": 2e-2, "fp8": 1e-1}


class VllmGqa:
    name = "vllm"
    op_type = "gqa"

    def supports(self, case: Case, device: str) -> Optional[str]:
        why = refusal(case.args)
        if why is not None:
            return why
        if device != "cuda":
            return f"device {device!r}: the vllm backend runs on CUDA GPUs"
        from operatorx.backends.vllm.env import vllm_missing

        return vllm_missing()

    def prepare(self, case: Case, device: str) -> Prepared:
        args = case.args
        assert isinstance(args, GqaArgs)
        why = self.supports(case, device)
        if why is not None:
            raise Unsupported(why)
        choice = module_choice(args)
        assert not isinstance(choice, str)
        from operatorx.backends.vllm.attention.build import build_gqa
        from operatorx.backends.vllm.common import VllmBackendBase

        built, stack = VllmBackendBase.build_in_stack(lambda stack: build_gqa(case, args, choice, stack))
        state: dict[str, Any] = {"built": built}

        def fn() -> Any:
            return state["built"].timed()

        def check() -> Check:
            from operatorx.backends.check import rel_error
            from operatorx.backends.torch.attention.reference import gqa_reference

            b = state["built"]
            out = b.in_layout_order(fn())
            ref = gqa_reference(args, b.weights, b.x, b.layout, b.cached)
            got = out[ref.rows.to(out.device)]
            graph = "; output of the CUDA-graph replay" if b.graph is not None else ""
            return Check(rel_error(got, ref.out), BOUND[args.kv_cache_dtype], int(ref.rows.numel()),
                         f"{ref.what}; cached K/V read back from vLLM's cache through its block table{graph}")

        layers: dict[str, Any] = {"module.forward": built.eager} if built.graph is not None else {}

        def release() -> None:
            layers.clear()
            state.clear()
            stack.close()
            gc.collect()          # vLLM modules sit in reference cycles (see moe.py's release)

        return Prepared(fn=fn, check=check, metadata=built.metadata, release=release, layers=layers)
