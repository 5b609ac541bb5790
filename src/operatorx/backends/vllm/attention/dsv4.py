"""The vllm dsv4_attn backend: DeepSeek-V4's DeepseekV4FlashMLAAttention from vLLM 0.26's own model code (on
sm90: FLASHMLA_SPARSE_DSV4), timed over its filled fp8_ds_mla caches.

prepare (untimed, dsv4_build.py): the module under a DeepSeek-V4 config stand-in, its block-FP8 projections
(DeepseekV4FP8Config) and bf16 compressors loaded from dsv4_weights, the 1 / 3 / 5 caches of its layer kind
(window; + compressed entries and compressor state; + indexer keys and indexer state) allocated as the runner
lays them out (padded pages), filled and bound, one metadata builder per cache over the batch at that cache's
block size. fn (timed, eager): the module's forward in one forward context: fused wq_a/wkv (and the
compressors' and weights_proj's GEMMs on aux streams), q/kv RMSNorm, wq_b with the fused q-norm / rope /
fp8 SWA insert, the compressor(s), the indexer's top-k (ratio 4), FlashMLA's sparse decode or chunked prefill
over window plus compressed entries with the sink, inverse rope and wo_a as DeepGEMM's fp8 einsum, wo_b.
check: the reference requests' rows against dsv4_reference on the same weights, inputs and cache contents as
vLLM holds them, attending vLLM's own top-k at ratio 4 (read back from topk_indices_buffer); the reference's
own top-k is compared apart (the overlap is in the check's description). Importing this module does not
import vLLM.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any, Optional

from operatorx.backends.vllm.attention.base import BuiltAttention, Reference, VllmAttentionBackend, with_topk_overlap
from operatorx.backends.vllm.attention.dsv4_support import dsv4_projection_plan, dsv4_refusal
from operatorx.backends.vllm.attention.mla import MLA_BOUND
from operatorx.spec import Case
from operatorx.spec.attention import Dsv4AttnArgs
from operatorx.spec.op_type import OpArgs

__all__ = ["VllmDsv4", "DSV4_BOUND", "DSV4_CHAINED_FP8"]

#: Block-FP8 projections one after another from the module's input to its output: wq_a -> wq_b -> wo_a -> wo_b
#: (wkv runs beside wq_a; the fp8_ds_mla cache's own rounding is modelled by the reference).
DSV4_CHAINED_FP8 = 4
#: The check's floor: MLA's (bf16 roundings of a latent attention over the same keys).
DSV4_BOUND = MLA_BOUND["bf16"]


class VllmDsv4(VllmAttentionBackend):
    op_type = "dsv4_attn"
    CACHE_READ = ("window rows, compressed entries, compressor states and index keys read back (dequantized) from "
                  "vLLM's caches through their block tables")

    def cache_read(self, args: Dsv4AttnArgs) -> str:
        """Only a ratio-4 layer attends vLLM's own top-k (its indexer's picks); ratio 128 attends every entry."""
        own_topk = "; attention over vLLM's own top-k (topk_indices_buffer)" if args.compress_ratio == 4 else ""
        return f"{self.CACHE_READ}{own_topk}"

    def refusal(self, args: OpArgs) -> Optional[str]:
        return dsv4_refusal(args)

    def build(self, case: Case, args: Dsv4AttnArgs, stack: ExitStack) -> BuiltAttention:
        from operatorx.backends.vllm.attention.dsv4_build import build_dsv4

        return build_dsv4(case, args, stack)

    def reference(self, args: Dsv4AttnArgs, built: Any, flavor: str) -> Reference:
        from operatorx.backends.torch.attention.dsv4_reference import dsv4_reference
        from operatorx.backends.vllm.attention.proj import activation

        selection = built.selection if args.compress_ratio == 4 else None
        ref = dsv4_reference(args, built.weights, built.x, built.layout, built.cached, activation(built.plan, flavor),
                             selection=selection)
        return ref if args.compress_ratio != 4 else with_topk_overlap(ref, built.metadata)

    def bound(self, args: Dsv4AttnArgs) -> float:
        from operatorx.backends.check import FP8_LAYER_ERROR

        plan = dsv4_projection_plan(args)
        fp8 = not isinstance(plan, str) and plan.scheme == "fp8_block"
        return max(DSV4_BOUND, FP8_LAYER_ERROR * DSV4_CHAINED_FP8 ** 0.5 if fp8 else 0.0)

