"""The kernel classes (report/kernel_class.py) on kernel names real runs recorded (docs/benchmarks.md,
the measure tests), including the ones where two rules could claim a name."""

from __future__ import annotations

import pytest

from operatorx.report.kernel_class import CLASSES, RULES, classify

NAMES = [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
     "gemm"),
    ("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN", "gemm"),
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT", "gemm"),
    ("void cutlass::device_kernel<vllm::cutlass_3x_gemm_sm90_fp8<c", "gemm"),
    ("void deep_gemm::sm90_fp8_gemm_1d2d_impl<(cute::UMMA::Major)0", "gemm"),
    ("fused_moe_kernel", "expert_gemm"),
    ("void per_token_group_quant_8bit_kernel<c10::BFloat16, c10::Float8_e4m3fn>", "quantize"),
    ("void vllm::dynamic_per_token_scaled_fp8_quant_kernel_strided", "quantize"),
    ("void vllm::scaled_fp8_quant_kernel_strided_group_shape<c10::", "quantize"),
    ("void vllm::act_and_mul_kernel<c10::BFloat16, __nv_bfloat162, &vllm::silu_kernel>", "activation"),
    ("silu_and_mul_per_block_quant", "activation"),            # fused activation and quantize: activation
    ("topk", "routing"),
    ("void moe_align_block_size_kernel<int>", "routing"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>", "reduce"),
    ("void vllm::moe::moe_sum_vec_kernel<c10::BFloat16, int, 8, false>", "reduce"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "collective"),   # a collective before `reduce`
    ("ncclDevKernel_AllGather_RING_LL", "collective"),
    ("Memset (Device)", "memory"),
    ("Memcpy DtoD (Device -> Device)", "memory"),
    ("vectorized_elementwise_kernel<fill>", "memory"),
    # an attention module's kernels (benchmarks §28: vllm gqa and torch gqa on the H200)
    ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm",
     "attention"),                                               # `cutlass` in the name: attention before gemm
    ("void cutlass::device_kernel<flash::FlashAttnFwdCombine<cute::tuple<cute::C<8>, cute::C<128> >, 5, 256, 1, fals",
     "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0",
     "attention"),
    ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>(__nv_bflo",
     "memory"),                                                  # `flash` in the name: a cache write before attention
    ("void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)",
     "memory"),
    ("void at::native::index_elementwise_kernel<128, 4, at::native::index_copy_kernel_impl<at::native::OpaqueType<2> >",
     "memory"),
    ("void vllm::rotary_embedding_kernel<c10::BFloat16, c10::BFloat16, true>(long const*, c10::BFloat16*, c10::BFloa",
     "rope"),
    ("<b>kernel</b>", "other"),
]


@pytest.mark.parametrize(("name", "want"), NAMES)
def test_classify_real_names(name, want):
    assert classify(name) == want


def test_every_rule_class_has_a_title_and_other_is_last():
    assert {r.kernel_class for r in RULES} | {"other"} == set(CLASSES)
    assert list(CLASSES)[-1] == "other"
