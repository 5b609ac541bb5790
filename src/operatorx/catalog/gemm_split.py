"""The catalog's per-rank GEMM shapes for `--rank-local` shards (spec/shard.py `LayerShapes`).

A name alone cannot tell every split: with more TP ranks than KV heads vLLM replicates the KV
heads, so `qkv_proj` is not N/tp. Where a case's source is a catalog checkpoint and the case is
that role's whole layer, the shard takes the catalog's own per-rank shape (gemm_roles at that TP).
"""

from __future__ import annotations

from functools import cache
from typing import Optional

from operatorx.catalog.checkpoints import load_catalog
from operatorx.catalog.errors import CatalogError
from operatorx.catalog.gemm_roles import gemm_shapes

__all__ = ["CatalogShapes", "CATALOG_SHAPES"]


@cache
def _shapes(checkpoint: str, tp: int) -> dict[str, tuple[int, int]]:
    """role -> (n, k) of a catalog checkpoint's GEMM layers at `tp` (empty if unknown or TP does not divide)."""
    for ckpt in load_catalog():
        if checkpoint == ckpt.id or checkpoint in ckpt.scheme_checkpoints.values():
            try:
                return {s.role: (s.n, s.k) for s in gemm_shapes(ckpt.arch, tp, False, [], ckpt.not_produced)}
            except CatalogError:
                return {}
    return {}


class CatalogShapes:
    def rank_shape(self, source: str, tp: int, full: tuple[int, int]) -> Optional[tuple[int, int]]:
        checkpoint, _, role = source.rpartition("/")
        if _shapes(checkpoint, 1).get(role) != full:
            return None
        return _shapes(checkpoint, tp).get(role)


CATALOG_SHAPES = CatalogShapes()
