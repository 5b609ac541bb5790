"""Fixtures for store tests: a SQLite file per test, and a PostgreSQL database per test session.

PostgreSQL runs at 127.0.0.1:5432 (trust auth, user postgres; override with OPERATORX_TEST_PG, a URL
to the server's `postgres` database). Each session creates its own database `ox_store_<hex>` and drops
it after; each test starts from an empty schema in it. Unreachable server: the PostgreSQL tests skip
with the reason, except in CI (env CI set, or OPERATORX_REQUIRE_POSTGRES=1), where that is a failure.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from operatorx.result import Row
from operatorx.spec import Case
from tests.conftest import gemm

PG_ADMIN = os.environ.get("OPERATORX_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _require_postgres() -> bool:
    return bool(os.environ.get("CI")) or os.environ.get("OPERATORX_REQUIRE_POSTGRES") == "1"


def _admin_connect() -> Any:
    import psycopg

    return psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5)


@pytest.fixture(scope="session")
def pg_server_db() -> Iterator[str]:
    """The session's own PostgreSQL database, as a URL."""
    try:
        admin = _admin_connect()
    except Exception as err:             # no driver, or no server
        if _require_postgres():
            pytest.fail(f"PostgreSQL is required here (CI) but unreachable at {PG_ADMIN}: {err}")
        pytest.skip(f"PostgreSQL unreachable at {PG_ADMIN} ({str(err).strip().splitlines()[0]}); "
                    "CI runs these tests")
    name = f"ox_store_{secrets.token_hex(6)}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with _admin_connect() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url(pg_server_db: str) -> str:
    """The session database, emptied: each test sees a database with no tables."""
    import psycopg

    with psycopg.connect(pg_server_db, autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    return pg_server_db


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """Each store test runs against both databases."""
    if request.param == "sqlite":
        return str(tmp_path / "ox.db")
    return str(request.getfixturevalue("pg_url"))


def case(i: int, **extra: Any) -> Case:
    return Case.model_validate({**gemm(m=i + 1), "sources": ["org/model-x/q_proj"], **extra})


def planned(n: int, backend: str = "torch", side: str = "") -> list[Row]:
    return [Row.missing(case(i), backend, "t", i, side=side) for i in range(n)]


def done(i: int, latency_us: float = 2.0, status: str = "ok", side: str = "", backend: str = "torch") -> Row:
    metrics = {"latency_us": latency_us, "samples_us": [latency_us] * 3, "scheme": "bf16", "tflops": 1.5,
               "gbps": 300.0} if status == "ok" else {}
    return Row(case=case(i), backend=backend, status=status, testlist="t", case_index=i,  # type: ignore[arg-type]
               message=None if status == "ok" else "why", side=side, metrics=metrics,
               error_kind="exception" if status == "error" else None)
