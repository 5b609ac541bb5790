"""Where results go: an SQL database (SQLite by default) and result documents."""

from operatorx.store.db import RunNotFound, Store, database_url
from operatorx.store.document import document_csv, write_json_atomic

__all__ = ["RunNotFound", "Store", "database_url", "document_csv", "write_json_atomic"]
