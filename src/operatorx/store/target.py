"""What `--db` names, checked before anything is opened or created.

A `--db` is a file path (SQLite), `sqlite:///PATH`, or `postgresql://USER@HOST:PORT/DB` (also
`postgres://` and `postgresql+psycopg://`; OperatorX talks to PostgreSQL through psycopg 3). Every way
it can be wrong becomes a StoreError with one line: what is wrong and what to do.
"""

from __future__ import annotations

import os
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from operatorx.store.errors import StoreError
from operatorx.store.redact import MASK, hide_password

__all__ = ["DbTarget", "parse_db", "check_sqlite_path", "require_psycopg", "PG_CONNECT_TIMEOUT_S",
           "KNOWN_FORMS"]

PG_CONNECT_TIMEOUT_S = 5
KNOWN_FORMS = "a file path or sqlite:///PATH (SQLite), postgresql://USER@HOST:PORT/DB (PostgreSQL)"
_SQLITE_MAGIC = b"SQLite format 3\x00"
_PG_NAMES = ("postgresql", "postgres")


@dataclass(frozen=True)
class DbTarget:
    spec: str = field(repr=False)               # as the user gave it: may hold a password, so never shown
    kind: Literal["sqlite", "postgresql"]
    path: Optional[Path] = None                 # SQLite
    url: Optional[URL] = None                   # PostgreSQL, with the psycopg driver

    def display(self) -> str:
        """How messages, documents and stored runs name it: the path, or the URL with any password
        (given in its user part or as a `password=` option) shown as `***`."""
        if self.kind == "sqlite":
            return str(self.path)
        assert self.url is not None
        return self.url.set(drivername="postgresql").render_as_string(hide_password=True)

    def flag(self) -> str:
        """`--db X` for the commands a message suggests: as the user gave it for a file, the display
        form for a URL (a password is never printed; `***` tells the user to put theirs back)."""
        shown = self.spec if "://" not in self.spec else self.display()
        return f"--db {shlex.quote(shown)}"

    def scrub(self, text: str) -> str:
        """`text` (a driver's message) with this target's password, decoded or as typed, hidden."""
        text = hide_password(text)
        if self.url is not None:
            secret = self.url.password
            if isinstance(secret, str) and secret:
                text = text.replace(secret, MASK)
        return text


def parse_db(db: str) -> DbTarget:
    """The target a `--db` names; raises StoreError for an empty value, a URL that cannot be read,
    or a kind of database OperatorX does not speak."""
    if not db or not db.strip():
        raise StoreError(f"--db is empty: give {KNOWN_FORMS}")
    if "://" not in db:
        return DbTarget(db, "sqlite", path=Path(db).expanduser())
    scheme = db.split("://", 1)[0]
    try:
        url = make_url(db)
    except (ArgumentError, ValueError) as err:
        raise StoreError(hide_password(f"--db {db!r} is not a database URL OperatorX can read ({err}): give "
                                       f"{KNOWN_FORMS}")) from None
    name = url.get_backend_name()
    driver = url.get_driver_name() if "+" in url.drivername else ""
    if name == "sqlite":
        if not url.database or url.database == ":memory:":
            raise StoreError(f"--db {hide_password(db)}: an in-memory SQLite database keeps nothing; give a file, "
                             "e.g. sqlite:///operatorx.db")
        return DbTarget(db, "sqlite", path=Path(url.database).expanduser())
    if name in _PG_NAMES:
        if driver not in ("", "psycopg", "psycopg2", "psycopg_async"):
            raise StoreError(f"--db {hide_password(db)}: OperatorX talks to PostgreSQL through psycopg 3, not "
                             f"{driver}; write postgresql://USER@HOST:PORT/DB")
        if not url.database:
            raise StoreError(f"--db {hide_password(db)}: no database name; write postgresql://USER@HOST:PORT/DB")
        return DbTarget(db, "postgresql", url=_password_in_userinfo(url).set(drivername="postgresql+psycopg"))
    raise StoreError(f"--db {hide_password(db)}: unknown database kind {scheme!r}; OperatorX knows {KNOWN_FORMS}")


def _password_in_userinfo(url: URL) -> URL:
    """A `?password=` option (libpq reads it as the password) moved to the URL's password, which
    SQLAlchemy hides wherever it shows a URL (its repr, an engine's, its errors)."""
    given = url.query.get("password")
    if given is None:
        return url
    password = given if isinstance(given, str) else given[-1]
    return url.difference_update_query(["password"]).set(password=password)


def require_psycopg(target: DbTarget) -> None:
    try:
        import psycopg  # noqa: F401
    except ImportError as err:
        raise StoreError(f"--db {target.display()}: PostgreSQL needs the psycopg driver, which is not "
                         f"installed ({err}): pip install \"operatorx[postgres]\"") from None


def _read_only_file(path: Path) -> bool:
    """Not writable by us — or, for root (who may write anything), marked read-only by its mode:
    a file someone chmod'ed read-only is not one a benchmark should write into."""
    if not os.access(path, os.W_OK):
        return True
    return os.geteuid() == 0 and not path.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)


def check_sqlite_path(target: DbTarget, *, create: bool, write: bool) -> None:
    """Everything about a SQLite file that can be known without opening it; creates nothing."""
    path = target.path
    assert path is not None
    if path.is_dir():
        raise StoreError(f"--db {path} is a directory: give a file path such as {path / 'operatorx.db'}")
    if not path.exists():
        parent = path.parent
        if not create:
            raise StoreError(f"no database at {path}: check the path, or create one with "
                             f"`operatorx db init {target.flag()}`")
        if not parent.is_dir():
            raise StoreError(f"--db {path}: directory {parent} does not exist: create it (mkdir -p {parent}) "
                             "or choose another --db path")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise StoreError(f"--db {path}: cannot create a file in {parent} (not writable): choose a "
                             "directory you can write to")
        return
    if not os.access(path, os.R_OK):
        raise StoreError(f"--db {path} is not readable: fix its permissions (chmod u+r {path})")
    size = path.stat().st_size
    if size:
        with open(path, "rb") as f:
            head = f.read(len(_SQLITE_MAGIC))
        if head != _SQLITE_MAGIC:
            what = "a text file" if _looks_like_text(head) else "some other kind of file"
            raise StoreError(f"--db {path} is not an SQLite database (it is {what}): choose another --db "
                             "path, or move that file away")
    if write:
        if _read_only_file(path):
            raise StoreError(f"--db {path} is read-only: make it writable (chmod u+w {path}) or choose "
                             "another --db path")
        if not os.access(path.parent, os.W_OK | os.X_OK):
            raise StoreError(f"--db {path}: its directory {path.parent} is not writable, and SQLite keeps "
                             "its -wal and -shm files beside the database: make it writable or move the file")


def _looks_like_text(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(c >= 32 or c in (9, 10, 13) for c in head)


def sqlite_error_kind(err: BaseException) -> str:
    """A SQLite failure in a word: locked, readonly, corrupt, notadb, cantopen, full, other."""
    text = str(err).lower()
    code = getattr(getattr(err, "orig", err), "sqlite_errorname", "") or ""
    if "locked" in text or "busy" in text or code.startswith("SQLITE_BUSY") or code.startswith("SQLITE_LOCKED"):
        return "locked"
    if "readonly" in text or "read-only" in text or code.startswith("SQLITE_READONLY"):
        return "readonly"
    if "not a database" in text or code == "SQLITE_NOTADB":
        return "notadb"
    if "malformed" in text or "corrupt" in text or code.startswith("SQLITE_CORRUPT"):
        return "corrupt"
    if "unable to open" in text or code.startswith("SQLITE_CANTOPEN"):
        return "cantopen"
    if "disk is full" in text or code == "SQLITE_FULL":
        return "full"
    return "other"

