"""The vllm mla_dsa backend: DeepSeek-V3.2's DeepseekV2MLAAttention (its Indexer and sparse MLA) from vLLM
0.26's own model code, timed over filled latent and indexer caches.

prepare (untimed, dsa_build.py): the module with its Indexer, the bf16 weights (dsa_weights) loaded, the
sparse MLA backend vLLM picked and its block size, the latent cache and the indexer's fp8 key cache
allocated, filled and bound as vLLM's runner does, both metadata builders' metadata. fn (timed): the
module's forward in one forward context: the MLA projections, the indexer (wq_b, wk_weights_proj,
k LayerNorm, RoPE, fp8 quantization, the key cache write, DeepGEMM logits, top-k into
topk_indices_buffer), the latent cache write, the sparse absorbed attention over the picked keys, o_proj.
check: the reference requests' rows against dsa_reference on the same weights, inputs and caches as vLLM
holds them, attending vLLM's own selection (read back from topk_indices_buffer); the reference's own
top-k is compared with it apart (the overlap is in the check's description). `indexer: reuse` (vLLM's skip
layer) has no Indexer: the buffer is filled once with an earlier layer's picks (dsa_reuse), the timed call
reads it, and the reference attends the same picks. Importing this module does
not import vLLM.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any, Optional

from operatorx.backends.vllm.attention.base import BuiltAttention, Reference, VllmAttentionBackend, with_topk_overlap
from operatorx.backends.vllm.attention.dsa_support import dsa_projection_plan, dsa_refusal
from operatorx.backends.vllm.attention.mla import MLA_BOUND
from operatorx.spec import Case
from operatorx.spec.attention import MlaDsaArgs
from operatorx.spec.op_type import OpArgs

__all__ = ["VllmMlaDsa", "DSA_BOUND"]

#: The check's bound with bf16 projections: the MLA one (the attention over the same selection is MLA's
#: arithmetic over fewer keys).
DSA_BOUND = MLA_BOUND["bf16"]


class VllmMlaDsa(VllmAttentionBackend):
    op_type = "mla_dsa"
    CACHE_READ = ("cached latents and fp8 indexer keys read back from vLLM's caches through its block table; "
                  "attention over vLLM's own top-k (topk_indices_buffer)")

    def refusal(self, args: OpArgs) -> Optional[str]:
        return dsa_refusal(args)

    def build(self, case: Case, args: MlaDsaArgs, stack: ExitStack) -> BuiltAttention:
        from operatorx.backends.vllm.attention.dsa_build import build_dsa

        return build_dsa(case, args, stack)

    def reference(self, args: MlaDsaArgs, built: Any, flavor: str) -> Reference:
        from operatorx.backends.torch.attention.dsa_reference import dsa_reference
        from operatorx.backends.vllm.attention.proj import activation

        reuse = args.indexer == "reuse"
        ref = dsa_reference(args, built.weights, built.x, built.layout, built.cached,
                            None if reuse else built.cached_keys, activation(built.plan, flavor),
                            selection=built.selection, latent_quantized=built.latent_quantized)
        return ref if reuse else with_topk_overlap(ref, built.metadata)

    def bound(self, args: MlaDsaArgs) -> float:
        from operatorx.backends.check import fp8_projection_bound

        plan = dsa_projection_plan(args)
        fp8 = not isinstance(plan, str) and plan.scheme == "fp8_block"
        return max(DSA_BOUND, fp8_projection_bound("mla") if fp8 else 0.0)

