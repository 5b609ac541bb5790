"""The attention step of the timed call: K/V gathered through the page table, then torch SDPA per chunk.

The rule: the batch's requests are cut into chunks of one batch group each (same q), small enough
that a chunk's gathered K/V stays under GATHER_BUDGET_BYTES; each chunk is one
`scaled_dot_product_attention` call over [requests, heads, q, keys]. Requests of a chunk whose key
counts differ (a ctx range) are padded to the longest and masked. Why chunks of a group: one SDPA
call per chunk keeps launches few (a 64-request decode is one call), while the materialized K/V of a
long-context batch never has to exist whole.

Masks, chosen so SDPA can take its fused kernels on CUDA:
- decode (q = 1): grouped query heads are folded into query rows ([B, kv_heads, q_heads/kv_heads,
  d] against [B, kv_heads, L, d]): plain MHA shapes, K/V never repeated; no mask when the
  requests' key counts are equal, else [B, 1, 1, L] hiding the padding;
- prefill from an empty context (every ctx 0, no window): `is_causal` (q = L, top-left causal);
- anything else (a context before the new tokens, a window, a ctx range): a boolean mask
  [B, 1, q, L], built once in prepare. Prefill repeats K/V over the query heads of their group
  (torch's memory-efficient kernel, the one that takes a mask, has no grouped-query form).

The gather index and the masks are built in prepare (untimed), as a server builds its attention
metadata outside the layer; the gather itself, the up-projection a caller does on it (MLA) and
SDPA are timed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from operatorx.backends.torch.attention.layout import Layout, Request

__all__ = ["GATHER_BUDGET_BYTES", "Chunk", "plan_chunks", "attend", "KvFn"]

#: Most bytes of gathered (and, for MLA, up-projected) K/V one SDPA call holds.
GATHER_BUDGET_BYTES = 1 << 30

#: (gather index [B, L] of pool slots) -> (K [B, kv_heads, L, dk], V [B, kv_heads, L, dv]).
KvFn = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Chunk:
    """One SDPA call: requests of one group, rows [row0, row0 + count·q) of the call's tokens."""

    row0: int
    count: int
    q: int
    keys: int
    index: torch.Tensor
    """[count, keys] pool slots (padding repeats a request's first key; the mask hides it)."""
    mask: Optional[torch.Tensor]
    """[count, 1, q, keys] bool, True where a query attends; None with `causal` or no mask needed."""
    causal: bool

    @property
    def fold(self) -> bool:
        """Decode: the grouped query heads become query rows (a mask [B, 1, 1, L] broadcasts over them)."""
        return self.q == 1


def _mask(reqs: list[Request], keys: int, window: Optional[int]) -> torch.Tensor:
    """True where new token i of request r may read its gathered key j: its position key_start + j is at most
    ctx + i, within the window, and not padding."""
    q = reqs[0].q
    pos_key = torch.stack([torch.arange(keys) + r.key_start for r in reqs])[:, None, :]            # [B, 1, L]
    pos_query = torch.stack([torch.arange(q) + r.ctx for r in reqs])[:, :, None]                    # [B, q, 1]
    ok = pos_key <= pos_query
    if window is not None:
        ok &= pos_key > pos_query - window
    return ok[:, None]


def _chunk(reqs: list[Request], window: Optional[int], device: str) -> Chunk:
    keys = max(r.keys for r in reqs)
    rows = []
    for r in reqs:
        slots = r.slots(r.key_start, r.key_start + r.keys)
        rows.append(torch.cat([slots, slots[:1].expand(keys - r.keys)]))
    index = torch.stack(rows).to(device)
    q, ctx0 = reqs[0].q, {r.ctx for r in reqs}
    equal = len({r.keys for r in reqs}) == 1
    causal = q > 1 and ctx0 == {0} and window is None
    plain_decode = q == 1 and equal          # one token reads all its gathered keys (a window already cut them)
    mask = None if causal or plain_decode else _mask(reqs, keys, window).to(device)
    return Chunk(reqs[0].row0, len(reqs), q, keys, index, mask, causal)


def plan_chunks(layout: Layout, bytes_per_key: int, device: str) -> list[Chunk]:
    """The layout's SDPA calls: consecutive requests of one group, each chunk's keys · bytes_per_key
    under GATHER_BUDGET_BYTES (a single request over it is a chunk of its own)."""
    chunks: list[Chunk] = []
    run: list[Request] = []
    for r in layout.requests:
        widest = max([x.keys for x in run] + [r.keys])
        if run and (r.group != run[0].group or (len(run) + 1) * widest * bytes_per_key > GATHER_BUDGET_BYTES):
            chunks.append(_chunk(run, layout.window, device))
            run = []
        run.append(r)
    chunks.append(_chunk(run, layout.window, device))
    return chunks


def attend(chunks: list[Chunk], q: torch.Tensor, kv: KvFn, scale: float) -> torch.Tensor:
    """q [T, heads, dk] (rows in layout order) -> [T, heads · dv]: each chunk's SDPA over its gathered K/V."""
    heads = q.shape[1]
    outs = []
    for c in chunks:
        k, v = kv(c.index)                                       # [B, kv_heads, L, dk], [B, kv_heads, L, dv]
        kv_heads, group = k.shape[1], heads // k.shape[1]
        rows = q[c.row0:c.row0 + c.count * c.q]
        if c.fold:
            qc = rows.view(c.count, kv_heads, group, -1)          # one token: its query heads as rows
            out = F.scaled_dot_product_attention(qc, k, v, attn_mask=c.mask, scale=scale)
            outs.append(out.reshape(c.count, -1))
            continue
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        qc = rows.view(c.count, c.q, heads, -1).transpose(1, 2)
        out = F.scaled_dot_product_attention(qc, k, v, attn_mask=c.mask, is_causal=c.causal, scale=scale)
        outs.append(out.transpose(1, 2).reshape(c.count * c.q, -1))
    return outs[0] if len(outs) == 1 else torch.cat(outs)
