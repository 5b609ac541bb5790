"""Checkpoint catalog → testlists. Facts live in data files (checkpoints/*.json); no torch here."""

from operatorx.catalog.checkpoints import Checkpoint, find_checkpoints, load_catalog
from operatorx.catalog.errors import CatalogError, CatalogWarning, MissingField
from operatorx.catalog.generate import DECODE_M, MOE_TOKENS, PREFILL_M, from_config, generate
from operatorx.catalog.testlists import SHIPPED, build_shipped, write_shipped

__all__ = [
    "Checkpoint", "CatalogError", "CatalogWarning", "MissingField", "DECODE_M", "PREFILL_M", "MOE_TOKENS",
    "find_checkpoints", "load_catalog", "generate", "from_config", "SHIPPED", "build_shipped", "write_shipped",
]
