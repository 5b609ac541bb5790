"""Where each request's tokens live: its drawn context, its pages of the KV pool, its slots, its keys.

The rule: the pool holds Σ ceil((ctx + q) / page_tokens) pages of page_tokens tokens (PAGE_TOKENS, 16,
unless the caller's kernel needs other pages: vLLM's FlashMLA pages by 64). `contiguous`
gives the requests consecutive pages in pool order; `shuffled` gives them a random permutation of the
pool (seeded by `batch.seed`), so a request's pages are scattered as in a long-running server. A ctx
range draws each request's context uniformly in [min, max] from `batch.seed` too, so every backend
and every process sees the same draws. Why here: the timed call, the memory estimate and the
reference all read one plan instead of re-deriving it.

Keys: new token i of a request (position ctx + i) attends the cached and new tokens at positions
<= ctx + i (causal among the new tokens); with a `window` W only the last W of them. A request's
gathered keys start at `key_start` = max(0, ctx - (W - 1)) (0 without a window), so a windowed
decode reads W keys, never the whole context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from operatorx.spec.attention import Batch

__all__ = ["PAGE_TOKENS", "Request", "Layout", "plan_layout", "pages_for"]

#: Tokens per KV-cache page (vLLM's default block size).
PAGE_TOKENS = 16


def pages_for(tokens: int, page_tokens: int = PAGE_TOKENS) -> int:
    """Pages of `page_tokens` that hold `tokens` tokens."""
    return -(-tokens // page_tokens)


@dataclass(frozen=True)
class Request:
    """One request of the batch: `q` new tokens after `ctx` cached ones, rows [row0, row0 + q) of [T, hidden]."""

    group: int
    ctx: int
    q: int
    row0: int
    pages: tuple[int, ...]
    """Its pages of the pool, in token order."""
    key_start: int
    """The first position its attention reads (window: ctx - (W - 1) at least)."""
    page_tokens: int = PAGE_TOKENS
    """Tokens per page of the pool."""

    @property
    def keys(self) -> int:
        """Keys gathered for the request: positions key_start .. ctx + q - 1."""
        return self.ctx + self.q - self.key_start

    def slot(self, position: int) -> int:
        """The pool slot (page · page_tokens + offset) of the token at `position`."""
        return self.pages[position // self.page_tokens] * self.page_tokens + position % self.page_tokens

    def slots(self, start: int, stop: int) -> torch.Tensor:
        """The slots of positions start .. stop - 1 (int64, on the CPU)."""
        pos = torch.arange(start, stop, dtype=torch.int64)
        table = torch.tensor(self.pages, dtype=torch.int64)
        return table[pos // self.page_tokens] * self.page_tokens + pos % self.page_tokens


@dataclass(frozen=True)
class Layout:
    requests: tuple[Request, ...]
    pool_pages: int
    pages: str
    window: Optional[int]
    page_tokens: int = PAGE_TOKENS

    @property
    def tokens(self) -> int:
        return sum(r.q for r in self.requests)

    @property
    def pool_slots(self) -> int:
        return self.pool_pages * self.page_tokens

    def write_slots(self) -> torch.Tensor:
        """The slot of every new token, in row order: each call writes these same slots (ctx .. ctx + q - 1)."""
        return torch.cat([r.slots(r.ctx, r.ctx + r.q) for r in self.requests])

    def ctx_summary(self) -> dict[str, float]:
        ctx = [r.ctx for r in self.requests]
        return {"min": min(ctx), "mean": sum(ctx) / len(ctx), "max": max(ctx)}


def _draws(batch: Batch) -> list[list[int]]:
    """Each group's per-request contexts: the int, or uniform draws in [min, max] from batch.seed."""
    gen = torch.Generator().manual_seed(batch.seed)
    out = []
    for g in batch.groups:
        if isinstance(g.ctx, int):
            out.append([g.ctx] * g.count)
        else:
            out.append(torch.randint(g.ctx.min, g.ctx.max + 1, (g.count,), generator=gen).tolist())
    return out


def plan_layout(batch: Batch, window: Optional[int] = None, page_tokens: int = PAGE_TOKENS) -> Layout:
    """Every request's context, pages of `page_tokens` tokens, rows and first key (the rules in the
    module docstring)."""
    draws = _draws(batch)
    sizes = [(gi, ctx, g.q) for gi, (g, ctxs) in enumerate(zip(batch.groups, draws, strict=True)) for ctx in ctxs]
    total = sum(pages_for(ctx + q, page_tokens) for _, ctx, q in sizes)
    if batch.pages == "shuffled":
        gen = torch.Generator().manual_seed(batch.seed + 1)
        order = torch.randperm(total, generator=gen).tolist()
    else:
        order = list(range(total))
    requests, row, page = [], 0, 0
    for gi, ctx, q in sizes:
        n = pages_for(ctx + q, page_tokens)
        start = 0 if window is None else max(0, ctx - (window - 1))
        requests.append(Request(gi, ctx, q, row, tuple(order[page:page + n]), start, page_tokens))
        row, page = row + q, page + n
    return Layout(tuple(requests), total, batch.pages, window, page_tokens)
