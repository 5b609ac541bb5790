"""The Runs page's group and shard columns and the run group page, in a real browser (Debian's Chromium
through Playwright), served and from disk: what they show is checked against the store, and no page
logs a console error."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from operatorx.store import Store
from operatorx.store.group import group_document
from tests.web.conftest import free_port, watched_page
from tests.web.test_pairs import planted  # noqa: F401 - the fixture these tests use

STATUSES = ("ok", "unsupported", "error", "missing")


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    with watched_page(browser, 1400, 900) as pg:
        yield pg


@pytest.fixture
def served(planted: str) -> Iterator[str]:  # noqa: F811 - the imported fixture
    import uvicorn

    from operatorx.web import Queries
    from operatorx.web.app import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(Queries.open(planted)), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def _column(pg: Any, table: str, title: str) -> list[str]:
    """The texts of one column of a rendered table, by its header."""
    heads = [h.strip(" ▲▼") for h in pg.locator(f"{table} thead th").all_inner_texts()]
    i = heads.index(title) + 1
    return [t.strip() for t in pg.locator(f"{table} tbody tr td:nth-child({i})").all_inner_texts()]


def _check_runs_page(pg: Any, db: str) -> None:
    with Store(db, read_only=True) as store:
        stored = store.list_runs()
    pg.wait_for_selector("#runs-table tbody tr")
    ids = _column(pg, "#runs-table", "run")
    assert sorted(ids) == sorted(r["id"] for r in stored)
    by_id = {r["id"]: r for r in stored}
    assert _column(pg, "#runs-table", "group") == [by_id[i]["run_group"] or "" for i in ids]
    assert _column(pg, "#runs-table", "shard") == [by_id[i]["shard"] or "" for i in ids]


def _check_group_page(pg: Any, db: str, case_href: str) -> None:
    with Store(db, read_only=True) as store:
        doc = group_document(store, "nightly")
        shards = [r for r in store.list_runs() if r["run_group"] == "nightly"]
    want = {s: sum(r["status"] == s for r in doc["rows"]) for s in STATUSES}
    assert want == {"ok": 4, "unsupported": 0, "error": 1, "missing": 1}
    pg.wait_for_selector("#rows-table tbody tr")
    for s in STATUSES:
        assert pg.inner_text(f"#group-total td[data-status='{s}']") == str(want[s])
        assert pg.inner_text(f"#status-counts [data-status='{s}']") == f"{s} {want[s]}"
    shown_shards = pg.locator("#shards tbody tr .run-link").all_inner_texts()
    assert sorted(shown_shards) == sorted(r["id"] for r in shards)
    assert pg.locator("#rows-table tbody tr").count() == len(doc["rows"]) == 6
    assert _column(pg, "#rows-table", "status") == [r["status"] for r in doc["rows"]]
    assert _column(pg, "#rows-table", "shard") == ["0/2"] * 3 + ["1/2"] * 3
    pg.select_option("#f-shard", "1/2")
    assert pg.inner_text("#count") == "3 of 6 rows" and "shard=1%2F2" in pg.url
    assert pg.get_attribute("#rows-table tbody tr:first-child a.case-link", "href") == case_href
    pg.click("#rows-table tbody tr:first-child a.case-link")
    pg.wait_for_load_state()
    assert pg.evaluate("JSON.parse(document.getElementById('ox-data').textContent).run.id") == "n-1"
    assert pg.url.endswith(case_href)


def test_runs_page_group_and_shard_columns_and_the_group_page_served(page, served, planted):  # noqa: F811
    page.goto(served + "/")
    _check_runs_page(page, planted)
    page.click("#runs-table a.group-link:text-is('nightly') >> nth=0")
    page.wait_for_load_state()
    assert page.url.endswith("/group/nightly")
    _check_group_page(page, planted, "/case/n-1/3")


def test_the_group_page_from_disk(page, planted, tmp_path):  # noqa: F811
    from operatorx.web import Queries
    from operatorx.web.site import build_site

    site = build_site(Queries.open(planted), tmp_path / "site", workers=1)
    page.goto((site.directory / "index.html").as_uri())
    _check_runs_page(page, planted)
    page.click("#runs-table a.group-link:text-is('nightly') >> nth=0")
    page.wait_for_load_state()
    assert Path(page.url.split("?")[0]).name == "group-nightly.html"
    _check_group_page(page, planted, "case-n-1.html?case=3")
