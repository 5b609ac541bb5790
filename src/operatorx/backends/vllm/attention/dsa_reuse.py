"""The top-k an `indexer: reuse` mla_dsa layer reads: what an earlier layer's indexer left in vLLM's
topk_indices_buffer, drawn here in plain torch (no vLLM import).

The rule: one int32 row per new token in batch order, `topk` wide, request-relative key positions (what
sparse_attn_indexer writes and the sparse MLA backend turns into cache slots), -1 padding. A token at
position p sees keys 0 .. p: every one of them when p + 1 <= topk (as the indexer keeps all keys then),
else `topk` distinct positions drawn uniformly from 0 .. p. Each row is ascending. Why uniform: the
attention's cost follows how many keys it reads and how far they spread over the cache pages; which keys
an earlier layer's scores would pick depends on data a case does not have, so the draw is seeded and the
reference attends the very same picks.
"""

from __future__ import annotations

import torch

__all__ = ["DRAW_PEAK_BYTES", "reused_topk"]

#: Most bytes of random draws held at once.
DRAW_CHUNK_BYTES = 1 << 26
#: What one chunk's draw holds at its peak, at most: the fp32 draws, their mask, and topk's and sort's values and
#: int64 indices, which are as wide as the draws when topk is.
DRAW_PEAK_BYTES = 8 * DRAW_CHUNK_BYTES


def reused_topk(positions: torch.Tensor, topk: int, gen: torch.Generator) -> torch.Tensor:
    """int32 [len(positions), topk] on positions' device: each new token's picks (module docstring), rows in the
    order of `positions` (each token's position within its request)."""
    pos = positions.long()
    out = torch.full((pos.numel(), topk), -1, dtype=torch.int32, device=pos.device)
    if pos.numel() == 0:
        return out
    width = int(pos.max()) + 1
    step = max(1, DRAW_CHUNK_BYTES // (4 * width))
    cols = torch.arange(width, device=pos.device)
    for r0 in range(0, pos.numel(), step):
        seen = pos[r0:r0 + step, None] + 1                                      # keys each token sees
        draw = torch.rand((seen.shape[0], width), generator=gen, device=pos.device)
        draw.masked_fill_(cols[None, :] >= seen, 2.0)                            # unseen keys are never drawn first
        k = min(topk, width)
        picks = torch.topk(draw, k, dim=1, largest=False).indices
        picks = torch.where(picks < seen, picks, width).sort(dim=1).values     # -1 (as width) sorts last
        out[r0:r0 + step, :k] = torch.where(picks < width, picks, -1).to(torch.int32)
    return out
