"""Where results go: an SQL database (SQLite by default, PostgreSQL for a team) and result documents.

The names load on first use: the errors are light, but `Store` brings SQLAlchemy (0.3-0.4 s to
import), and the CLI imports this package for its error types before a run has spawned its workers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from operatorx.lazy import lazy_names
from operatorx.store.errors import RunNotFound, StoreError

if TYPE_CHECKING:
    from operatorx.store.db import Store, check_db, database_url
    from operatorx.store.document import document_csv, write_json_atomic

__all__ = ["RunNotFound", "Store", "StoreError", "check_db", "database_url", "document_csv", "write_json_atomic"]

_HOME = {"Store": "operatorx.store.db", "check_db": "operatorx.store.db", "database_url": "operatorx.store.db",
         "document_csv": "operatorx.store.document", "write_json_atomic": "operatorx.store.document"}

__getattr__ = lazy_names(__name__, _HOME)
