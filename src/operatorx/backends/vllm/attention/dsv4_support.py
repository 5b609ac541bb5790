"""Can a vllm dsv4_attn backend run this case? By field, without importing vLLM.

The rule: a dsv4_attn case runs as vLLM 0.26's DeepseekV4FlashMLAAttention (what _select_dsv4_attn_cls picks on
sm90, models/deepseek_v4/nvidia/model.py), one rank, over FLASHMLA_SPARSE_DSV4 and its 584-byte fp8_ds_mla cache:
- compress_ratio 0 (window only), 4 (compressor with overlap and its own indexer) or 128 (compressor); the
  layer has no shared / reused indexer and always compresses its own tokens (source);
- kv_cache_dtype fp8 or fp8_ds_mla (vLLM rewrites fp8* to fp8_ds_mla). `auto` is refused: the layer asserts an
  fp8 cache dtype (attention.py _resolve_dsv4_kv_cache_dtype) and the engine leaves `auto` as it is for the
  DeepSeek-V4 checkpoint (resolve_kv_cache_dtype_string reads only ModelOpt's kv_cache_quant_algo; V4's
  quantization_config is quant_method fp8), so `vllm serve` of that checkpoint needs --kv-cache-dtype fp8;
- the kernel constants: head_dim 512 (448 fp8 nope + 64 bf16 rope), rope_dim 64, index_dim 128; at most 128
  heads on the rank (FlashMLA's fp8 decode pads to 64 or 128); window and topk multiples of 64 (B_TOPK);
- projections: wq_a, wkv, wq_b, wo_a, wo_b, indexer.wq_b all block FP8 under one DeepseekV4FP8Config (wo_a runs
  only as DeepGEMM's fp8 einsum); the compressors and indexer.weights_proj bf16 (quant_config=None);
- selection natural (vLLM's own indexer picks).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Optional, Union

from operatorx.backends.vllm.attention.support import type_and_split
from operatorx.spec.attention import Dsv4AttnArgs
from operatorx.spec.op_type import OpArgs

if TYPE_CHECKING:
    from operatorx.backends.vllm.quant_map import Plan

__all__ = ["BF16_PROJECTIONS", "CACHE_DTYPE", "FP8_PROJECTIONS", "HEAD_DIM", "INDEX_DIM", "MAX_HEADS", "ROPE_DIM",
           "TOPK_BLOCK", "WO_A_BLOCK", "dsv4_padded_heads", "dsv4_projection_plan", "dsv4_refusal"]

#: The layer's head_dim, rope_dim and the indexer's head dim: FlashMLA's V4 kernels, the fp8_ds_mla token
#: (448 + 64) and the compressor's cutedsl kernel are built for these only.
HEAD_DIM, ROPE_DIM, INDEX_DIM = 512, 64, 128
#: FlashMLA's fp8 sparse decode runs 64 or 128 query heads (get_padded_num_q_heads raises above 128).
MAX_HEADS = 128
#: FlashMLA's B_TOPK on sm90: every top-k width it reads (the window, the indexer's topk) is a multiple of it.
TOPK_BLOCK = 64
#: wo_a's block-FP8 rows per scale: the grouped weight is viewed as [groups, o_lora_rank / 128, ...] scales.
WO_A_BLOCK = 128
#: The projections DeepseekV4FP8Config builds in block FP8 (quant_config passed), in the module's order.
FP8_PROJECTIONS = ("wq_a", "wkv", "wq_b", "wo_a", "wo_b", "indexer.wq_b")
#: The projections vLLM builds with quant_config=None (bf16 raw matmuls); indexer.wk does not exist in V4.
BF16_PROJECTIONS = ("compressor.wkv", "compressor.wgate", "indexer.weights_proj", "indexer.compressor.wkv",
                    "indexer.compressor.wgate")
#: The CacheConfig.cache_dtype a runnable case builds with (the layer rewrites it to fp8_ds_mla).
CACHE_DTYPE = "fp8"


def dsv4_padded_heads(heads: int) -> int:
    """The query heads FlashMLA computes for `heads` on the rank: 64 up to 64, else 128 (flashmla.py)."""
    if heads > MAX_HEADS:
        raise ValueError(f"{heads} heads: FlashMLA's DeepSeek-V4 decode runs at most {MAX_HEADS}")
    return 64 if heads <= 64 else 128


def _module_fp8(args: Dsv4AttnArgs) -> tuple[str, ...]:
    """The block-FP8 projections this case's module has (indexer.wq_b only with the ratio-4 indexer)."""
    return tuple(n for n in FP8_PROJECTIONS if n != "indexer.wq_b" or args.indexer is not None)


def dsv4_projection_plan(args: Dsv4AttnArgs) -> Union[Plan, str]:
    """The one DeepseekV4FP8Config plan over the module's block-FP8 projections, or why there is none.

    Each of FP8_PROJECTIONS must be 128x128 block FP8 (an absent one is bf16: refused, wo_a first since vLLM
    has no bf16 path for it at all); the weight scales ue8m0 (DeepseekV4FP8Config.is_scale_e8m0, expert_dtype
    fp4) or fp32 (expert_dtype fp8); BF16_PROJECTIONS must be bf16 (no load path for a quantized one).
    """
    from operatorx.backends.vllm.quant_map import _DSV4_CONFIG, linear_plan, pair_scheme

    proj = args.proj or {}
    for name in BF16_PROJECTIONS:
        pair = proj.get(name)
        if pair is not None and (scheme := pair_scheme(pair.a, pair.b, f"proj.{name}")) != "bf16":
            return (f"proj.{name}: {scheme}; vLLM 0.26 builds the compressors' fused_wkv_wgate and the indexer's "
                    "weights_proj with quant_config=None (bf16), no quantized load path")
    names = _module_fp8(args)
    order = ("wo_a", *(n for n in names if n != "wo_a"))
    scale_dtypes: set[str] = set()
    for name in order:
        pair = proj.get(name)
        if pair is None:
            if name == "wo_a":
                return ("proj.wo_a bf16 (absent from proj): vLLM 0.26 runs wo_a only as DeepGEMM's block-FP8 einsum "
                        "(deep_gemm_fp8_o_proj reads wo_a.weight_scale_inv)")
            return (f"proj.{name} bf16 beside block-FP8 wo_a: DeepseekV4FP8Config builds every attention projection "
                    "in block FP8 (no ignored layers)")
        scheme = pair_scheme(pair.a, pair.b, f"proj.{name}")
        if scheme != "fp8_block":
            return scheme if scheme.startswith("proj.") else (
                f"proj.{name}: {scheme}; vLLM 0.26's DeepSeek-V4 attention projections are 128x128 block FP8 "
                "(DeepseekV4FP8Config) only")
        assert pair.b.scale is not None
        scale_dtypes.add(pair.b.scale.dtype)
    if not scale_dtypes <= {"ue8m0", "fp32"} or len(scale_dtypes) > 1:
        return (f"proj: weight scales in {sorted(scale_dtypes)}: DeepseekV4FP8Config loads one scale dtype, ue8m0 "
                "(expert_dtype fp4) or fp32 (expert_dtype fp8)")
    weight = proj["wo_a"].b
    plan = linear_plan("fp8_block", weight)
    (scale_dtype,) = scale_dtypes
    return replace(plan, quant=_DSV4_CONFIG, weight_scale_dtype="ue8m0" if scale_dtype == "ue8m0" else "fp32",
                   expected_sm90=("DeepseekV4FP8Config → Fp8LinearMethod → DeepGemmFp8BlockScaledMMKernel; wo_a as "
                                  "DeepGEMM fp8_einsum bhr,hdr->bhd (sm90_fp8_bmm)"),
                   notes=plan.notes + (f"block-FP8 projections: {', '.join(names)}; bf16 (quant_config=None): the "
                                       "compressors' fused_wkv_wgate and indexer.weights_proj",))


def _shape_refusal(args: Dsv4AttnArgs) -> Optional[str]:
    """The kernel constants (module docstring), by field."""
    if args.head_dim != HEAD_DIM:
        return (f"head_dim={args.head_dim}: vLLM 0.26's DeepSeek-V4 kernels (FlashMLA V4, the 584-byte fp8_ds_mla "
                f"token, the compressor) are built for head_dim {HEAD_DIM}")
    if args.rope_dim != ROPE_DIM:
        return (f"rope_dim={args.rope_dim}: the fp8_ds_mla token keeps {HEAD_DIM - ROPE_DIM} fp8 nope + {ROPE_DIM} "
                "bf16 rope dims (fixed in vLLM 0.26's insert and gather kernels)")
    if args.index_dim is not None and args.index_dim != INDEX_DIM:
        return (f"index_dim={args.index_dim}: vLLM 0.26's DeepSeek-V4 indexer keys are {INDEX_DIM} fp8 dims with one "
                "fp32 scale (its compressor's head-128 quant path)")
    if args.heads > MAX_HEADS:
        return (f"heads={args.heads} on the rank: FlashMLA's DeepSeek-V4 fp8 decode runs 64 or 128 query heads "
                "(get_padded_num_q_heads raises above 128)")
    if args.window % TOPK_BLOCK:
        return (f"window={args.window}: FlashMLA reads the window as a top-k of width window, which must be a multiple "
                f"of B_TOPK={TOPK_BLOCK} on sm90")
    if args.topk is not None and args.topk % TOPK_BLOCK:
        return f"topk={args.topk}: FlashMLA's top-k width must be a multiple of B_TOPK={TOPK_BLOCK} on sm90"
    if args.o_lora_rank % WO_A_BLOCK:
        return (f"o_lora_rank={args.o_lora_rank}: vLLM views wo_a's block scales per group as "
                f"[o_groups, o_lora_rank / {WO_A_BLOCK}, ...] (deepgemm_post_process_fp8_weight_block)")
    return None


def dsv4_refusal(args: OpArgs) -> Optional[str]:
    """None when a vllm dsv4_attn backend can build the case (vLLM and the device aside); else why, by field."""
    why = type_and_split(args, Dsv4AttnArgs, "dsv4_attn")
    if why is not None:
        return why
    assert isinstance(args, Dsv4AttnArgs)
    if args.indexer in ("shared", "reuse"):
        return (f"indexer={args.indexer}: vLLM 0.26's DeepSeek-V4 layer builds its own DeepseekV4Indexer at ratio 4; "
                "it has no layer that shares or reuses another layer's indexer")
    if args.compress_ratio in (1, 2):
        return (f"compress_ratio={args.compress_ratio}: vLLM 0.26's DeepSeek-V4 compresses at ratios 4 and 128 only "
                "(CompressorStateCache asserts compress_ratio in [4, 128])")
    if not args.source:
        return ("source=false: every vLLM 0.26 DeepSeek-V4 layer with compress_ratio > 1 builds its own "
                "DeepseekCompressor and compressed cache; none reads another layer's")
    if args.index_cache_dtype == "mxfp4":
        return ("index_cache_dtype=mxfp4: vLLM 0.26's MXFP4 indexer cache asserts 'use_fp4_indexer_cache requires "
                "Blackwell datacenter GPUs (sm_10x, e.g. B200/GB200)' (DeepseekV32IndexerMetadataBuilder)")
    if args.kv_cache_dtype == "bf16":
        return ("kv_cache_dtype=bf16: on sm90 vLLM 0.26 builds DeepseekV4FlashMLAAttention, whose cache is fp8_ds_mla "
                "only; the bf16 cache is FLASHINFER_MLA_SPARSE_DSV4's, sm_10x / sm_12x only")
    if args.kv_cache_dtype == "auto":
        return ("kv_cache_dtype=auto: vLLM 0.26's DeepSeek-V4 layer asserts an fp8 cache ('DeepseekV4 fp8_ds_mla "
                "layout only supports fp8 kv-cache, got auto'); the engine resolves auto only from a ModelOpt "
                "kv_cache_quant_algo, which the DeepSeek-V4 checkpoint lacks, so it serves with --kv-cache-dtype fp8")
    why = _shape_refusal(args)
    if why is not None:
        return why
    plan = dsv4_projection_plan(args)
    if isinstance(plan, str):
        return plan
    if args.selection != "natural":
        return f"selection={args.selection}: this backend runs vLLM's own indexer (natural selection) only"
    return None
