"""Can the vllm mla_dsa backend run this case? By field, without importing vLLM.

The rule: an mla_dsa case runs as DeepSeek-V3.2's DeepseekV2MLAAttention (its config has index_topk),
one rank, with its own Indexer:
- projections: the MLA ones and indexer.wq_b share one scheme (bf16 or block FP8, support.projection_plan's
  rule on the mla case of the same module); indexer.wk and indexer.weights_proj are vLLM's one fused bf16
  `wk_weights_proj` (quant_config=None). A block-FP8 wk (as DeepSeek-V3.2's checkpoint stores it) is
  dequantized by vLLM's loader into that bf16 layer, so it runs as vLLM runs it and the row says so
  (WK_UPCAST); any other quantized wk, or a quantized weights_proj, has no load path in vLLM: refused;
- `indexer: reuse` is vLLM's IndexCache skip layer (index_topk_pattern "S": no Indexer is built, and the
  sparse attention reads the top-k an earlier layer left in topk_indices_buffer): the MLA projections' plan
  alone, no indexer field is checked;
- `index_dim` 128 (own indexer): the indexer's fp8 key cache keeps one fp32 scale per 128 dims
  (quant_block_size 128) and the read-back here (dsa_layout) lays out one per token;
- `kv_cache_dtype`: auto / bf16 (a bf16 latent cache [blocks, 64, kv_lora_rank + rope_dim]: on sm90
  FLASH_ATTN_MLA_SPARSE takes it); fp8 / fp8_ds_mla (FLASHMLA_SPARSE's 656-byte token layout) is refused
  until its fill and read-back are built;
- `selection`: natural only (vLLM's own indexer picks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

from operatorx.backends.torch.attention.dsa import mla_args
from operatorx.backends.vllm.attention.support import projection_plan, type_and_split
from operatorx.spec.attention import MlaDsaArgs
from operatorx.spec.op_type import OpArgs

if TYPE_CHECKING:
    from operatorx.backends.vllm.quant_map import Plan

__all__ = ["INDEX_QUANT_BLOCK", "UNQUANTIZED_INDEXER", "WK_UPCAST", "dsa_projection_plan", "dsa_refusal",
           "wk_upcast"]

#: The indexer key cache's fp8 quantization block (vLLM's Indexer.quant_block_size).
INDEX_QUANT_BLOCK = 128
#: The indexer projections vLLM fuses into its bf16 wk_weights_proj.
UNQUANTIZED_INDEXER = ("indexer.wk", "indexer.weights_proj")
#: What a row with a block-FP8 indexer.wk records: the weight as vLLM holds it.
WK_UPCAST = ("proj.indexer.wk is block FP8: vLLM 0.26's loader (_try_load_fp8_indexer_wk) dequantizes it into the "
             "bf16 fused wk_weights_proj, which is what runs (bf16 weights here)")


def _scheme(args: MlaDsaArgs, name: str) -> str:
    from operatorx.backends.vllm.quant_map import pair_scheme

    pair = (args.proj or {}).get(name)
    return "bf16" if pair is None else pair_scheme(pair.a, pair.b, f"proj.{name}")


def wk_upcast(args: MlaDsaArgs) -> bool:
    """Whether the case's indexer.wk is the block-FP8 weight vLLM upcasts at load (module docstring)."""
    return _scheme(args, "indexer.wk") == "fp8_block"


def dsa_projection_plan(args: MlaDsaArgs) -> Union[Plan, str]:
    """The plan the MLA projections and indexer.wq_b share, or why there is none (module docstring)."""
    if args.indexer == "reuse":
        return projection_plan(mla_args(args))
    for name in UNQUANTIZED_INDEXER:
        scheme = _scheme(args, name)
        if scheme != "bf16" and not (name == "indexer.wk" and scheme == "fp8_block"):
            return (f"proj.{name}: {scheme}; vLLM 0.26 fuses indexer.wk and indexer.weights_proj into one bf16 "
                    "wk_weights_proj (quant_config=None) and dequantizes only a block-FP8 wk into it at load")
    plan = projection_plan(mla_args(args))
    if isinstance(plan, str):
        return plan
    scheme = _scheme(args, "indexer.wq_b")
    if scheme != plan.scheme:
        return (f"proj.indexer.wq_b: {scheme} beside {plan.scheme} MLA projections; vLLM builds the indexer's wq_b "
                "under the module's one quant config")
    return plan


def dsa_refusal(args: OpArgs) -> Optional[str]:
    """None when the vllm mla_dsa backend can build the case (vLLM and the device aside); else why, by field."""
    why = type_and_split(args, MlaDsaArgs, "mla_dsa")
    if why is not None:
        return why
    assert isinstance(args, MlaDsaArgs)
    plan = dsa_projection_plan(args)
    if isinstance(plan, str):
        return plan
    own = args.indexer == "own"
    if own and args.index_dim != INDEX_QUANT_BLOCK:
        return (f"index_dim={args.index_dim}: the indexer's fp8 key cache is read back here for "
                f"{INDEX_QUANT_BLOCK} dims (one fp32 scale per token, vLLM's quant_block_size); others not built")
    if own and args.rope_dim > args.index_dim:
        return f"rope_dim={args.rope_dim}: vLLM's indexer rotates the first rope_dim of index_dim={args.index_dim}"
    if args.kv_cache_dtype in ("fp8", "fp8_ds_mla"):
        return (f"kv_cache_dtype={args.kv_cache_dtype}: FLASHMLA_SPARSE's fp8_ds_mla latent cache (656 bytes a "
                "token: 512 e4m3, 4 fp32 scales, 64 bf16 rope) is not filled or read back by this backend yet, nor "
                "are the new tokens' fp8 roundings in its reference")
    if args.selection != "natural":
        return f"selection={args.selection}: this backend runs vLLM's own indexer (natural selection) only"
    return None
