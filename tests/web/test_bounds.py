"""`serve` bounds every parameter (400, one line saying why) and answers 404 for a run or case the
database lacks, never 500 and never a page for nothing: against real SQLite and PostgreSQL."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from operatorx.store import Store
from operatorx.web import Queries
from operatorx.web.app import MAX_RUN_REF_CHARS, MAX_SHAPE_RUNS, create_app
from tests.store.conftest import done, pg_server_db, pg_url, planned  # noqa: F401 - fixtures used by name


def _fill(db: str) -> None:
    store = Store(db)
    store.begin_run("r1", "2026-11-30T00:00:00", "t", "torch", "cpu", {}, planned(2))
    store.put_row("r1", done(0))
    store.finish_run("r1", "2026-11-30T00:10:00")
    store.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_db(request: pytest.FixtureRequest, tmp_path) -> str:  # type: ignore[no-untyped-def]
    """Each test against both databases (the store tests' PostgreSQL database, emptied per test)."""
    return str(tmp_path / "ox.db") if request.param == "sqlite" else str(request.getfixturevalue("pg_url"))


@pytest.fixture
def client(store_db: str) -> Iterator[TestClient]:
    _fill(store_db)
    queries = Queries.open(store_db)
    yield TestClient(create_app(queries), raise_server_exceptions=False)
    queries.store.close()


def _message(html: str) -> str:
    m = re.search(r'<p class="error" id="error">(.*?)</p>', html, re.S)
    assert m, html[:500]
    return m.group(1)


LONG = "x" * 50_001


@pytest.mark.parametrize("url, why", [
    (f"/run/{LONG}", "50,001 characters"),
    (f"/roofline/{LONG}", "50,001 characters"),
    (f"/case/{LONG}/0", "50,001 characters"),
    (f"/compare?a=r1&b={LONG}", "b: 50,001 characters"),
    (f"/compare?a={LONG}&b=r1", "a: 50,001 characters"),
    (f"/shape?runs={LONG}", "runs: 50,001 characters"),
    ("/shape?runs=" + ",".join(["r1"] * (MAX_SHAPE_RUNS + 1)), f"{MAX_SHAPE_RUNS} at most"),
    ("/run/a%00b", "control or invisible"),
    ("/run/r%1B%5B31m1", "control or invisible"),
    ("/compare?a=r1&b=%E2%80%AEx", "control or invisible"),
    ("/shape?runs=a%00", "control or invisible"),
    ("/case/r1/" + "9" * 5000, "at most 9 digits"),
    ("/case/r1/-1", "whole number"),
    ("/case/r1/1e3", "whole number"),
    ("/compare?a=r1", "give both a and b"),
    ("/compare?b=r1", "give both a and b"),
])
def test_a_parameter_out_of_bounds_is_400_with_one_line(client, url, why):
    r = client.get(url)
    assert r.status_code == 400, (url, r.status_code, r.text[:300])
    message = _message(r.text)
    assert why in message and "\n" not in message and len(message) < 300
    assert "Traceback" not in r.text and "x" * 300 not in r.text
    assert "content-security-policy" in r.headers


@pytest.mark.parametrize("url", ["/run/nope", "/roofline/nope", "/case/nope/0", "/case/r1/7", "/case/r1/999999999",
                                 "/compare?a=r1&b=nope", "/compare?a=nope&b=r1", "/shape?runs=nope",
                                 "/run/" + "y" * MAX_RUN_REF_CHARS])
def test_an_unknown_run_or_case_is_404(client, url):
    r = client.get(url)
    assert r.status_code == 404, (url, r.status_code, r.text[:300])
    assert "no run" in _message(r.text) or "no case" in _message(r.text)


def test_known_runs_still_answer_200(client):
    for url in ("/", "/run/r1", "/run/r", "/run/latest", "/roofline/r1", "/case/r1/0", "/shape?runs=r1",
                "/shape", "/compare", "/compare?a=r1&b=r1"):
        assert client.get(url).status_code == 200, url
