"""The vllm mla backend: DeepSeek-V2/V3's DeepseekV2MLAAttention from vLLM 0.26's own model code, timed over a
filled paged latent cache.

prepare (untimed, mla_build.py): the module built under the case's cache config, the torch backend's
bf16 MLA weights loaded into it (fused_qkv_a_proj = [q_a; kv_a]) and vLLM's process_weights_after_loading
(kv_b_proj split into W_UK_T / W_UV), the MLA backend vLLM picked and the block size it prefers, a
latent cache [blocks, block_size, kv_lora_rank + rope_dim] allocated and bound as vLLM's runner does
and filled with random values for every request's context, the backend's metadata built once from the
layout (decodes first, split from prefills at the builder's threshold). fn (timed): the module's forward
inside vLLM's forward context: fused q/kv-a projection, norms, q_b_proj, RoPE (YaRN), the cache write
of the new tokens, forward_mqa (absorbed) for the decodes and forward_mha (up-projected, chunked
context) for the prefills, o_proj. check: the reference requests' rows against the torch backend's
fp32 absorbed-form reference on the same weights, inputs and the cache as vLLM holds it.
Importing this module does not import vLLM.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any, Optional

from operatorx.backends.vllm.attention import BOUND
from operatorx.backends.vllm.attention.base import BuiltAttention, Reference, VllmAttentionBackend
from operatorx.backends.vllm.attention.support import mla_refusal, projection_bound
from operatorx.spec import Case
from operatorx.spec.attention import MlaArgs
from operatorx.spec.op_type import OpArgs

__all__ = ["VllmMla", "MLA_BOUND"]

#: ||out - ref|| / ||ref|| by `kv_cache_dtype`: gqa's. bf16 cache: the bf16 module's roundings (the absorbed
#: decode path also rounds q·W_UK and the latent mix to bf16 before W_UV); fp8 cache: the decode kernel
#: (FlashMLA's fp8 path) also takes q·W_UK and the new token's latent in e4m3, as FA3 takes q and new K/V.
MLA_BOUND = BOUND


class VllmMla(VllmAttentionBackend):
    op_type = "mla"
    CACHE_READ = "cached latents read back from vLLM's cache through its block table"

    def refusal(self, args: OpArgs) -> Optional[str]:
        return mla_refusal(args)

    def build(self, case: Case, args: MlaArgs, stack: ExitStack) -> BuiltAttention:
        from operatorx.backends.vllm.attention.mla_build import build_mla

        return build_mla(case, args, stack)

    def reference(self, args: MlaArgs, built: Any, flavor: str) -> Reference:
        from operatorx.backends.torch.attention.reference import mla_reference
        from operatorx.backends.vllm.attention.proj import activation

        return mla_reference(args, built.weights, built.x, built.layout, built.cached, activation(built.plan, flavor),
                             built.latent_quantized)

    def bound(self, args: MlaArgs) -> float:
        return max(MLA_BOUND[args.kv_cache_dtype], projection_bound(args))
