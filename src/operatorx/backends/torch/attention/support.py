"""Can the torch attention backend really run this gqa / mla case here? Each refusal names its field.

Built: bf16 projections (F.linear) or block FP8 ones on CUDA (F.scaled_mm, proj.py), a bf16 paged KV
cache, one device. Refused, never emulated: other projection schemes, an fp8 KV cache, a split over
ranks, MLA's output gate (its form is assumed in the cost only).
"""

from __future__ import annotations

from typing import Optional

from operatorx.backends.torch.attention.proj import projection_refusal
from operatorx.spec.attention import AttentionArgs, GqaArgs, MlaArgs

__all__ = ["refusal", "MULTI_RANK"]

MULTI_RANK = ("multi-rank attention is not built in the torch backend (heads over tp, the cache over dcp, "
              "the batch over dp); --rank-local has no attention shard either")


def refusal(args: AttentionArgs, device: str) -> Optional[str]:
    """None when the case can really run on `device`; else the reason, naming the field."""
    if device not in ("cuda", "cpu"):
        return f"device {device!r}: the torch attention backend runs on cuda and cpu"
    if args.parallel is not None and not args.parallel.is_single:
        return f"parallel {args.parallel.label()}: {MULTI_RANK}"
    why = projection_refusal(args, device)
    if why is not None:
        return why
    if isinstance(args, (GqaArgs, MlaArgs)) and args.kv_cache_dtype == "fp8":
        return ("kv_cache_dtype=fp8: the torch attention backend keeps a bf16 cache only (an e4m3 cache with "
                "a dequantizing read is not built)")
    if isinstance(args, MlaArgs) and args.gate:
        return "gate: MLA's output gate (g_proj, Kimi-K3) is assumed in the cost only; its form is not built here"
    if not isinstance(args, (GqaArgs, MlaArgs)):
        return f"{args.TYPE}: the torch attention backend runs gqa and mla"
    return None
