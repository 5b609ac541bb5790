"""Database URLs with their passwords hidden: the only form of a `--db` that leaves the parent.

A password may ride in a URL's user part (`postgresql://USER:PASSWORD@HOST/DB`) or in its query
(`?password=...`, which libpq also reads). Documents, stored runs, printed lines, error messages and
pages carry the display form (`postgresql://USER:***@HOST/DB`), so a result file shared with a team
or a CI log never hands the database over with it. No SQLAlchemy here: run/config.py uses this in
the parent before the database is imported.
"""

from __future__ import annotations

import re

__all__ = ["MASK", "hide_password", "SECRET_ENV"]

MASK = "***"

#: Environment variables that hold a database secret: never recorded, never handed to a worker.
SECRET_ENV = ("OPERATORX_DB", "PGPASSWORD")

# scheme://USER:PASSWORD@ — the password runs to the first '@', as SQLAlchemy reads it
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)(?P<password>[^@\n]*)@")
# ?password=... or &password=... (a libpq option given as a query parameter)
_QUERY = re.compile(r"(?P<head>[?&]password=)(?P<password>[^&\s#]*)", re.IGNORECASE)


def hide_password(text: str) -> str:
    """`text` with every URL password in it replaced by `***`: a `--db` value, or a message that may
    quote one. Text without a URL password comes back unchanged."""
    if "://" not in text and "password=" not in text.lower():
        return text
    text = _USERINFO.sub(lambda m: f"{m['head']}{MASK}@" if m["password"] else m[0], text)
    return _QUERY.sub(lambda m: f"{m['head']}{MASK}" if m["password"] else m[0], text)
