"""An `ab` run and a comparison of two contended runs on the dashboard: the A/B run's Run and Case pages
show both sides, the paired median difference B−A (labelled as such) and the verdict; the Compare page
and the Run page carry every flag the terminal table gives, whole. Over the server (page data, and
Chromium driven by Playwright), and the Case page from the static site on disk."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from operatorx.report.ab import DIFFERENCE_SAYS
from operatorx.result import Row
from operatorx.store import Store
from operatorx.web import Queries
from operatorx.web.app import create_app
from tests.web.conftest import free_port, page_data, watched_page

WHY = ("38 of 60 samples taken lost the CPU (run-queue wait > 5% of their wall time, schedstat_run_delay) and were "
       "dropped: the machine was busy; the number is from the clean ones")
CASES = [{"type": "gemm", "sources": ["test/ab"], "args": {"m": m, "n": 64, "k": 64, "a": {"dtype": "fp32"},
                                                            "b": {"dtype": "fp32"}, "out": "fp32"}} for m in (1, 4)]


@dataclass(frozen=True)
class AbDb:
    path: Path
    ab: str
    contended_a: str
    contended_b: str
    ab_doc: dict[str, Any]


def _contended_rows(factor: float, seed: int) -> list[Row]:
    rng = np.random.default_rng(seed)
    from operatorx.spec import Case

    rows = []
    for i, c in enumerate(CASES):
        s = [float(v) * factor for v in 20 * np.exp(rng.normal(0, 0.01, 60))]
        rows.append(Row(case=Case.model_validate(c), backend="torch", status="ok", testlist="contended", case_index=i,
                        metrics={"latency_us": float(np.median(s)), "samples_us": s, "clock": "host",
                                 "method": "host_clock/perf_counter", "scheme": "fp32",
                                 "timing": {"cpu_contended": True, "cpu_contended_why": WHY}}))
    return rows


@pytest.fixture(scope="module")
def ab_db(tmp_path_factory: pytest.TempPathFactory) -> AbDb:
    tmp = tmp_path_factory.mktemp("abweb")
    db, tl = tmp / "ab.db", tmp / "tl.json"
    tl.write_text(json.dumps(CASES))
    cmd = [sys.executable, "-m", "operatorx", "ab", "--a", "torch", "--b", "torch", "-t", str(tl), "--device", "cpu",
           "--batches", "7", "--batch-calls", "20", "--executor", "inline", "--db", str(db),
           "--results-dir", str(tmp / "docs")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    store = Store(str(db))
    ab_doc = store.document("latest")
    ids = []
    for n, (factor, seed) in enumerate(((1.0, 1), (0.9, 2))):          # B 10% faster: "faster" by the numbers
        rid = f"contended-{'ab'[n]}"
        rows = _contended_rows(factor, seed)
        store.begin_run(rid, f"2026-12-0{n + 1}T00:00:00+00:00", "contended", "torch", "cpu", {},
                        [Row.missing(r.case, r.backend, "contended", r.case_index) for r in rows])
        for r in rows:
            store.put_row(rid, r)
        store.finish_run(rid, f"2026-12-0{n + 1}T01:00:00+00:00")
        ids.append(rid)
    store.close()
    return AbDb(path=db, ab=ab_doc["run"]["id"], contended_a=ids[0], contended_b=ids[1], ab_doc=ab_doc)


@pytest.fixture(scope="module")
def client(ab_db: AbDb) -> TestClient:
    return TestClient(create_app(Queries.open(str(ab_db.path))))


def test_the_ab_run_page_carries_both_sides_the_difference_and_the_verdict(client, ab_db):
    r = client.get(f"/run/{ab_db.ab}")
    assert r.status_code == 200 and 'id="ab-help"' in r.text and DIFFERENCE_SAYS in r.text
    rows = page_data(r.text)["rows"]
    assert len(rows) == 2 and all(x["status"] == "ok" for x in rows)
    for view, row in zip(rows, ab_db.ab_doc["rows"], strict=True):
        stored = row["metrics"]["ab"]["host"]
        host = view["ab"]["host"]
        assert (host["a_us"], host["b_us"], host["diff_us"], host["verdict"]) == (
            stored["a_us"], stored["b_us"], stored["diff_us"], stored["verdict"])
        assert host["ci_low_us"] <= host["diff_us"] <= host["ci_high_us"]
        assert view["ab"]["outputs"] == "bitwise" and view["ab"]["device"] is None       # torch vs torch, CPU


def test_the_ab_case_page_carries_both_sides(client, ab_db):
    data = page_data(client.get(f"/case/{ab_db.ab}/0").text)
    ab = data["case"]["metrics"]["ab"]
    assert set(ab["host"]["batch_us_per_call"]) == {"a", "b"} and ab["sides"]["a"]["spec"] == "torch"
    assert data["ab_says"] == DIFFERENCE_SAYS


def test_the_compare_page_carries_every_flag_and_why_a_verdict_was_held(client, ab_db):
    data = page_data(client.get(f"/compare?a={ab_db.contended_a}&b={ab_db.contended_b}").text)
    assert [c["verdict"] for c in data["cases"]] == ["ambiguous", "ambiguous"]
    for c in data["cases"]:
        assert c["numbers_verdict"] == "faster" and c["verdict_why"].endswith("under CPU contention")
        assert f"A and B: CPU contended: {WHY}" in c["flags"]
    assert any(f.startswith("placement not controlled in A and B") for f in data["flags"])


def test_the_run_and_case_pages_carry_the_terminal_notes_whole(client, ab_db):
    rows = page_data(client.get(f"/run/{ab_db.contended_a}").text)["rows"]
    assert all(f"CPU contended: {WHY}" in r["notes"] for r in rows)
    case = page_data(client.get(f"/case/{ab_db.contended_a}/1").text)["case"]
    assert case["notes"] == ["host clock (CPU)", f"CPU contended: {WHY}"]


# --- in a browser ---------------------------------------------------------------------------------



@pytest.fixture(scope="module")
def server_url(ab_db: AbDb) -> Iterator[str]:
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(Queries.open(str(ab_db.path))), host="127.0.0.1", port=port,
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


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    with watched_page(browser, 1600, 1000) as pg:
        yield pg


def _fmt(v: float) -> str:
    """ox.js `fmt(v, 2)` for the µs these rows hold (1 to 100)."""
    return f"{v:.2f}"


def test_browser_ab_run_page_shows_both_sides_and_the_verdict(page, server_url, ab_db):
    page.goto(f"{server_url}/run/{ab_db.ab}")
    page.wait_for_selector("#rows-table tbody tr")
    heads = page.locator("#rows-table thead th").all_inner_texts()
    assert "host: paired median difference B−A µs [CI]" in heads and "host A µs" in heads and "host B µs" in heads
    assert "latency µs" not in heads                          # an A/B row has no one number
    host = ab_db.ab_doc["rows"][0]["metrics"]["ab"]["host"]
    first = page.locator("#rows-table tbody tr").first
    cells = dict(zip(heads, first.locator("td").all_inner_texts(), strict=True))
    assert cells["host A µs"] == _fmt(host["a_us"]) and cells["host B µs"] == _fmt(host["b_us"])
    assert cells["host: paired median difference B−A µs [CI]"].startswith(f"{host['diff_us']:+.2f} [")
    assert cells["host verdict"].startswith(host["verdict"]) and cells["outputs"] == "bitwise"
    assert DIFFERENCE_SAYS in page.inner_text("#ab-help")


def test_browser_ab_case_page_shows_both_sides(page, server_url, ab_db, tmp_path):
    row = ab_db.ab_doc["rows"][1]
    ab = row["metrics"]["ab"]
    page.goto(f"{server_url}/case/{ab_db.ab}/{row['case_index']}")
    page.wait_for_selector("section[data-section='A/B: both sides']")
    batches = len(ab["host"]["batch_us_per_call"]["a"]) + len(ab["host"]["batch_us_per_call"]["b"])
    page.wait_for_selector("#plot-samples[data-drawn='1']")
    assert int(page.get_attribute("#plot-samples", "data-points")) == batches
    assert page.locator("#plot-samples .scatterlayer .trace").count() == 2          # A and B
    assert "did not run" not in page.inner_text("main")
    line = page.locator("#ab-clocks tbody tr").first.locator("td").all_inner_texts()
    assert line[:3] == ["host", _fmt(ab["host"]["a_us"]), _fmt(ab["host"]["b_us"])]
    assert line[3] == f"{ab['host']['diff_us']:+.2f}" and line[6].startswith(ab["host"]["verdict"])
    heads = page.locator("#ab-clocks thead th").all_inner_texts()
    assert "paired median difference B−A µs" in heads
    assert DIFFERENCE_SAYS in page.inner_text("section[data-section='A/B: both sides']")
    page.screenshot(path=str(tmp_path / "ab-case.png"))


def test_browser_compare_page_shows_the_flags_whole(page, server_url, ab_db):
    page.goto(f"{server_url}/compare?a={ab_db.contended_a}&b={ab_db.contended_b}")
    page.wait_for_selector("#compare-table tbody tr")
    rows = page.locator("#compare-table tbody tr")
    assert rows.count() == 2
    for i in range(2):
        text = rows.nth(i).inner_text()
        assert "ambiguous (faster by the numbers alone)" in text
        assert "faster by the numbers alone, not called so: under CPU contention" in text
        assert f"A and B: CPU contended: {WHY}" in text
    assert "placement not controlled in A and B" in page.inner_text("#compare-flags")
    page.goto(f"{server_url}/case/{ab_db.contended_b}/0")
    assert page.locator("#case-notes li").all_inner_texts() == ["host clock (CPU)", f"CPU contended: {WHY}"]
    page.goto(f"{server_url}/run/{ab_db.contended_b}")
    assert f"CPU contended: {WHY}" in page.locator("#rows-table tbody tr").first.locator("td.msg").last.inner_text()


def test_browser_static_ab_case_page_from_disk(page, ab_db, tmp_path):
    from operatorx.web.site import build_site

    site = build_site(Queries.open(str(ab_db.path)), tmp_path / "site", compare="none", workers=1)
    case = next(p for p in site.directory.glob("case-*.html") if ab_db.ab in p.name)
    page.goto(case.as_uri() + "?case=0")
    page.wait_for_selector("section[data-section='A/B: both sides']")
    assert page.locator("#ab-clocks tbody tr").count() == 1 and "did not run" not in page.inner_text("main")
