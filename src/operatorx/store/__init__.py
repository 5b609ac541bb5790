"""Where results go: an SQL database (SQLite by default, PostgreSQL for a team) and result documents."""

from operatorx.store.db import Store, check_db, database_url
from operatorx.store.document import document_csv, write_json_atomic
from operatorx.store.errors import RunNotFound, StoreError

__all__ = ["RunNotFound", "Store", "StoreError", "check_db", "database_url", "document_csv", "write_json_atomic"]
