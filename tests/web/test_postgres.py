"""The dashboard over PostgreSQL: pages from a fresh database (its own random name, dropped after), and a
connection that refuses writes (sessions default to READ ONLY transactions)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest
from sqlalchemy import text
from starlette.testclient import TestClient

from operatorx.store import Store
from operatorx.web import Queries, open_store
from operatorx.web.app import create_app
from tests.web.conftest import WebDb, _store_copy, page_data

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[dev]')")
SERVER = "postgresql://postgres@127.0.0.1:5432"


def _admin() -> object:
    try:
        return psycopg.connect(f"{SERVER}/postgres", autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as err:
        why = f"no PostgreSQL at 127.0.0.1:5432 ({str(err).strip().splitlines()[0]})"
        if os.environ.get("OPERATORX_REQUIRE_POSTGRES") == "1":      # CI has one: these tests must run
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture(scope="module")
def pg_url(web_db: WebDb) -> Iterator[str]:
    name = f"ox_web_{secrets.token_hex(4)}"
    admin = _admin()
    admin.execute(f'CREATE DATABASE "{name}"')  # type: ignore[attr-defined]
    url = f"{SERVER}/{name}"
    try:
        store = Store(url)
        _store_copy(store, web_db.doc_a, "pg-run", "2026-11-30T00:00:00+00:00", "gemm_perf", web_db.doc_a["rows"])
        store.close()
        yield url
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[attr-defined]
        admin.close()  # type: ignore[attr-defined]


def test_pages_from_postgres(pg_url, web_db):
    queries = Queries.open(pg_url)
    client = TestClient(create_app(queries))
    r = client.get("/run/pg-run")
    assert r.status_code == 200
    assert [x["index"] for x in page_data(r.text)["rows"]] == [x["case_index"] for x in web_db.doc_a["rows"]]
    assert client.get("/roofline/pg-run").status_code == 200
    assert client.get("/case/pg-run/0").status_code == 200
    queries.store.close()


def test_postgres_connection_is_read_only(pg_url):
    store = open_store(pg_url)
    with pytest.raises(Exception, match="read-only transaction"):
        with store.engine.begin() as conn:
            conn.execute(text("CREATE TABLE web_was_here (x integer)"))
    with store.engine.connect() as conn:
        assert conn.execute(text("SHOW transaction_read_only")).scalar() == "on"
    store.close()
