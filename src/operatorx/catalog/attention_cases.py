"""Attention cases of a checkpoint: its attention module under each deployed split, over decode and
prefill batches (issue 31's catalog part; docs/case-format.md, "Attention types").

- decode: `batch` requests, each one new token (q = 1) over `ctx` cached ones, for every batch in
  DECODE_BATCH and every ctx in DECODE_CTX that the model's `max_position_embeddings` holds;
- prefill: one request's chunk of q new tokens over ctx cached ones (PREFILL_CHUNKS: a first chunk at
  ctx 0, and a later one over an earlier chunk's cache, as chunked prefill runs it).
A case is the whole module (every head; with tp > 1 `parallel: {tp}`), from the same derivation the
serving scenarios use (catalog/serving_attention.py), so the two agree on what a model's attention
is. Sliding-window layers are their own case (gqa with `window`, cited `<id>/self_attn:sliding`);
DeepSeek-V4's layer kinds are one `dsv4_attn` case each (cited `<id>/attn:c<ratio>`), the kind with an
own indexer once per index-key cache (fp8, mxfp4), as upstream's dsv4_attn cases list them. A fact the
format cannot hold but that leaves the work alone (a llama3/yarn `rope_scaling`) is kept in the case's
`metadata`. A model whose attention the catalog cannot derive (no `rope_theta`, attention sinks, MLA
without q_lora_rank, DeepSeek-V4.1 without `compress_ratios`) gets none, and a note says why.

The shipped `attn_small` (catalog/testlists.py) keeps one H200 run to minutes: per model (its first
scheme, its smallest deployed TP) a decode of 16 and of 64 requests x ctx 8192 and one prefill chunk
(8192 new tokens over 8192 cached), i.e. three cases per module (per index-key cache for DeepSeek-V4's indexer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from operatorx.catalog.arch import Arch
from operatorx.catalog.errors import CatalogError
from operatorx.catalog.schemes import RoleSchemes
from operatorx.catalog.serving_attention import DSV4_INDEX_CACHES, attention_modules
from operatorx.spec import Case

__all__ = ["DECODE_BATCH", "DECODE_CTX", "PREFILL_CHUNKS", "attention_cases", "decode_batch", "prefill_batch"]

DECODE_BATCH = (1, 16, 64, 256)
DECODE_CTX = (1024, 8192, 32768, 131072)
PREFILL_CHUNKS = ((2048, 0), (8192, 0), (8192, 8192))
"""(q, ctx): new tokens of one request's chunk, and the tokens already in its cache."""


def decode_batch(requests: int, ctx: int) -> dict[str, Any]:
    return {"groups": [{"count": requests, "q": 1, "ctx": ctx}]}


def prefill_batch(q: int, ctx: int) -> dict[str, Any]:
    return {"groups": [{"count": 1, "q": q, "ctx": ctx}]}


def _batches(arch: Arch, decode: Sequence[tuple[int, int]], prefill: Sequence[tuple[int, int]]
             ) -> list[dict[str, Any]]:
    """The batches that fit the model's context (`max_position_embeddings`, where the config has it)."""
    longest = arch.opt("max_position_embeddings")
    fits = (lambda total: True) if not isinstance(longest, int) else (lambda total: total <= longest)
    out = [decode_batch(b, c) for b, c in decode if fits(c + 1)]
    out += [prefill_batch(q, c) for q, c in prefill if fits(q + c)]
    return out


def attention_cases(arch: Arch, schemes: RoleSchemes, source_id: str, tp: int, notes: list[str],
                    decode: Sequence[tuple[int, int]], prefill: Sequence[tuple[int, int]]) -> list[Case]:
    """The attention module (and the linear-attention module, where the model has one) over each batch,
    split over `tp`; `decode` is (requests, ctx) pairs, `prefill` (q, ctx) chunks."""
    out: list[Case] = []
    for batch in _batches(arch, decode, prefill):
        try:
            made = attention_modules(arch, schemes, batch, tp, 1, DSV4_INDEX_CACHES)
        except CatalogError as err:            # a fact the catalog lacks, or a type it does not derive
            notes.append(f"{arch.origin}: attention not produced: {err}")
            return out
        for m in made:
            out.append(Case.model_validate({"type": m.kind, "args": m.args, "sources": [f"{source_id}/{m.role}"],
                                            "metadata": dict(m.metadata)}))
    return out
