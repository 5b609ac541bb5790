"""Errors and warnings of the catalog; each names the checkpoint/config and the field at fault."""

from __future__ import annotations

__all__ = ["CatalogError", "CatalogWarning", "MissingField", "NotDerived"]


class CatalogError(ValueError):
    """Input the generator cannot turn into cases: a bad config, scheme, TP or model name."""


class CatalogWarning(UserWarning):
    """A role the generator skipped because a fact it needs was not confirmed."""


class MissingField(CatalogError):
    """A role needs a config field that is absent (or null).

    The catalog leaves unconfirmed facts out; generating from it turns this into a warning
    that names the field, while `from_config` turns it into an error.
    """

    def __init__(self, field: str, needed_for: str):
        self.field = field
        self.needed_for = needed_for
        super().__init__(f"config field '{field}' is missing; it is needed for {needed_for}")


class NotDerived(CatalogError):
    """Roles a model has whose per-rank shapes this package does not derive (yet); named in the message."""

    def __init__(self, roles: str, origin: str, reason: str = "their vLLM sharding is not modelled"):
        super().__init__(f"{roles} are not derived here ({reason}) ({origin})")
