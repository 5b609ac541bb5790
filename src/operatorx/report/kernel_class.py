"""What a GPU kernel does, read from its name: one class per kernel, for the Case page's timeline.

The rule table `RULES` is tried top to bottom and the first pattern that matches the name (case
ignored) wins; a name no rule matches is `other`. Order matters where names overlap: a KV-cache write
(`reshape_and_cache_flash_kernel`) is tried before attention (`flash`), attention before GEMMs, a collective
(`ncclDevKernel_AllReduce...`) is tried before `reduce`, routing and expert GEMMs (`fused_moe_kernel`,
`topk`) before plain GEMMs, a split-K reduction (`cublasLt::splitKreduce_kernel`) before the GEMM
library it comes from, a GEMM with a fused epilogue (`..._relu`) before activations, and a fused
activation-and-quantize kernel (`silu_and_mul_per_block_quant`) counts as activation. Names only:
the class is what the kernel's name says, never a measurement.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["KernelClass", "Rule", "RULES", "CLASSES", "classify"]

KernelClass = Literal["memory", "collective", "attention", "rope", "routing", "expert_gemm", "reduce",
                      "activation", "quantize", "gemm", "other"]


@dataclass(frozen=True)
class Rule:
    kernel_class: KernelClass
    pattern: str
    """A regular expression searched in the kernel's name, case ignored."""
    why: str
    """What names it is for."""


RULES: tuple[Rule, ...] = (
    Rule("memory", r"memset|memcpy|FillFunctor|\bfill\b",
         "the runtime's `Memset (Device)` and `Memcpy HtoD/DtoD` records, and torch's fill kernels"),
    Rule("memory", r"reshape_and_cache|concat_and_cache|index_copy|index_elementwise|vectorized_gather|"
                   r"CatArrayBatchedCopy|direct_copy",
         "KV-cache writes and gathers, concatenations and copies (`vllm::reshape_and_cache_flash_kernel`, torch's "
         "`index_copy_kernel_impl`, `vectorized_gather_kernel`, `direct_copy_kernel_cuda`), before `attention`"),
    Rule("collective", r"nccl", "NCCL's kernels (`ncclDevKernel_AllReduce_Sum_bf16_RING_LL`)"),
    Rule("attention", r"flash|fmha|sdpa|attn_fwd|attention|flashmla|mla_decode",
         "attention kernels (FlashAttention 3's `flash::FlashAttnFwdSm90` and its `FlashAttnFwdCombine`, cuDNN's "
         "`..._native_sdpa_sm90_flash_fprop_...`), before `gemm`: their names carry `cutlass` and `wgmma`"),
    Rule("rope", r"rotary|rope", "rotary position embedding (`vllm::rotary_embedding_kernel`)"),
    Rule("routing", r"topk|moe_align|count_and_sort|router|gating|moe_permute|moe_unpermute|expert_map",
         "expert choice and token ordering of a MoE layer (`topk`, `topkGatingSoftmax`, `moe_align_block_size`)"),
    Rule("expert_gemm", r"fused_moe|grouped_?(gemm|mm)|moe_gemm|m_grouped|GroupProblemShape|matmul_ogs|cutlass_moe",
         "GEMMs over many experts in one launch (`fused_moe_kernel`, CUTLASS grouped GEMMs, triton `matmul_ogs`)"),
    Rule("reduce", r"reduce|moe_sum|sum_kernel",
         "split-K and top-k sums (`cublasLt::splitKreduce_kernel`, `vllm::moe::moe_sum_vec_kernel`)"),
    Rule("gemm", r"gemm|gemv|nvjet|xmma|cutlass|cublas|matmul|wgmma",
         "dense GEMMs (`sm90_xmma_gemm_...`, cuBLAS `nvjet_...`, CUTLASS, DeepGEMM `sm90_fp8_gemm_1d2d_impl`)"),
    Rule("activation", r"act_and_mul|silu|gelu|swiglu|relu|swish",
         "activations, fused with the gate multiply or not (`vllm::act_and_mul_kernel`)"),
    Rule("quantize", r"quant",
         "casts to a narrow type with scales (`per_token_group_quant_8bit_kernel`, `scaled_fp8_quant_kernel`)"),
)

CLASSES: dict[str, str] = {"gemm": "GEMM", "expert_gemm": "expert GEMM", "attention": "attention", "rope": "RoPE",
                           "quantize": "quantize", "activation": "activation", "routing": "routing", "reduce": "reduce",
                           "collective": "collective", "memory": "memory (copy/set)", "other": "other"}
"""Every class by key, with the title a page shows; in the order a legend lists them."""

_COMPILED = tuple((r.kernel_class, re.compile(r.pattern, re.IGNORECASE)) for r in RULES)


def classify(name: str) -> KernelClass:
    """The class of the first rule in `RULES` whose pattern is found in `name`; `other` if none."""
    for kernel_class, pattern in _COMPILED:
        if pattern.search(name):
            return kernel_class
    return "other"
