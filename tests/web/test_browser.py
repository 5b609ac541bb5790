"""The dashboard in a real browser (Debian's Chromium driven by Playwright, headless): served on
127.0.0.1 and opened from disk (file://). Plots drew their points, filters change rows and the URL,
hostile rows stay text. Screenshots go to the test's tmp dir, and to OPERATORX_SCREENSHOTS when set
(pages of the test's runs; the README's docs/img/run.png is made from a real CPU run by
bench/dashboard_screenshot.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.web.conftest import WebDb, watched_page


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    with watched_page(browser, 1400, 900) as pg:
        yield pg


def _shot(pg: Any, name: str, tmp_path: Path) -> None:
    pg.screenshot(path=str(tmp_path / f"{name}.png"), full_page=False)
    where = os.environ.get("OPERATORX_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(Path(where) / f"{name}.png"), full_page=False)


def _points(pg: Any, plot_id: str) -> int:
    """Markers plotly drew in the plot (scatter points or histogram bars), and what the page meant to draw."""
    pg.wait_for_selector(f"#{plot_id}[data-drawn='1']", timeout=15000)
    meant = int(pg.get_attribute(f"#{plot_id}", "data-points"))
    return meant


def _ok_rows(web_db: WebDb) -> list[dict]:
    return [r for r in web_db.doc_a["rows"] if r["status"] == "ok"]


def test_runs_page_filter_changes_rows_and_url(page, server_url, web_db, tmp_path):
    page.goto(server_url + "/")
    rows = page.locator("#runs-table tbody tr")
    assert rows.count() == 3
    page.select_option("#f-testlist", "gemm_perf")
    assert rows.count() == 2 and "testlist=gemm_perf" in page.url
    _shot(page, "runs", tmp_path)
    page.reload()                                           # the URL carries the view
    assert page.locator("#runs-table tbody tr").count() == 2
    assert page.input_value("#f-testlist") == "gemm_perf"


def test_run_page_filter_sort_and_pages(page, server_url, web_db, tmp_path):
    page.goto(f"{server_url}/run/{web_db.run_a}")
    body = page.locator("#rows-table tbody tr")
    assert body.count() == len(web_db.doc_a["rows"])
    _shot(page, "run", tmp_path)
    page.select_option("#f-status", "ok")
    assert body.count() == len(_ok_rows(web_db)) and "status=ok" in page.url
    page.click("#rows-table th[data-key='tflops']")         # numbers sort largest first
    assert "sort=-tflops" in page.url
    best = max(_ok_rows(web_db), key=lambda r: r["metrics"]["tflops"])
    assert page.locator("#rows-table tbody tr").first.locator("td").first.inner_text() == str(best["case_index"])
    page.goto(f"{server_url}/run/{web_db.run_a}?status=unsupported&sort=latency_us")
    assert body.count() == len([r for r in web_db.doc_a["rows"] if r["status"] == "unsupported"])
    page.click("#rows-table tbody tr a.case-link")
    assert "/case/" in page.url


def test_roofline_plots_one_point_per_ok_case(page, server_url, web_db, tmp_path):
    page.goto(f"{server_url}/roofline/{web_db.run_a}")
    n = len(_ok_rows(web_db))
    assert _points(page, "plot-roofline") == n
    assert page.locator("#plot-roofline .scatterlayer .point").count() == n
    assert page.locator("#no-peaks").count() == 1          # CPU: no ceilings, and the page says so
    _shot(page, "roofline", tmp_path)
    page.goto(f"{server_url}/roofline/{web_db.run_b}")          # B has a peak: the ceiling is drawn too
    assert _points(page, "plot-roofline") == n
    assert page.locator("#plot-roofline .scatterlayer .trace").count() == 2    # the points, the ceiling
    assert page.locator("#no-peaks").count() == 0 and "test peak" in page.inner_text("main")


def test_shape_plots_a_line_per_run(page, server_url, web_db, tmp_path):
    page.goto(f"{server_url}/shape?runs={web_db.run_a},{web_db.run_b}")
    fam = page.input_value("#f-family")
    in_family = [r for r in _ok_rows(web_db) if r["label"].startswith("gemm ") and
                 fam.startswith("gemm Mx{n}x{k} ".format(**r["op"]["args"]))]
    assert _points(page, "plot-latency") == 2 * len(in_family)
    assert page.locator("#plot-latency .scatterlayer .trace").count() == 2
    assert page.locator("#plot-tflops .scatterlayer .point").count() == 2 * len(in_family)
    _shot(page, "shape", tmp_path)
    page.uncheck(f"#runs-pick input[data-run='{web_db.run_b}']")
    assert page.locator("#plot-latency .scatterlayer .trace").count() == 1 and "hide=1" in page.url


def test_case_page_draws_every_sample(page, server_url, web_db, tmp_path):
    row = _ok_rows(web_db)[0]
    page.goto(f"{server_url}/case/{web_db.run_a}/{row['case_index']}")
    assert _points(page, "plot-samples") == len(row["metrics"]["samples_us"])
    assert page.locator("#plot-samples .bars .point").count() > 0
    sections = page.locator("section.case-section h2").all_inner_texts()
    assert {"How it stopped", "Telemetry", "Check"} <= set(sections)
    _shot(page, "case", tmp_path)
    page.goto(f"{server_url}/case/{web_db.run_b}/{row['case_index']}")     # B's rows carry GPU-like parts
    page.wait_for_selector("section[data-section='Kernel breakdown']")
    kernels = page.locator("section[data-section='Kernel breakdown'] tbody tr")
    assert kernels.count() == 2 and kernels.nth(1).locator("td").first.inner_text() == "<b>kernel</b>"
    facts = page.locator("section[data-section='Kernel breakdown'] dl.kv").inner_text()
    assert "worker's launch gap µs\n1.10" in facts                     # (three significant figures)
    readings = page.locator("section[data-section='Telemetry'] table").first.inner_text()
    assert "sm_clock_mhz" in readings and "1,980" in readings and "power_w" in readings


def test_compare_page_ratio_table_and_plot(page, server_url, web_db, tmp_path):
    page.goto(f"{server_url}/compare?a={web_db.run_a}&b={web_db.run_b}")
    n = len(_ok_rows(web_db))
    assert _points(page, "plot-ratio") == n
    assert page.locator("#plot-ratio .scatterlayer .point").count() == n
    assert page.locator("#compare-table tbody tr").count() == len(web_db.doc_a["rows"])
    _shot(page, "compare", tmp_path)
    page.select_option("#f-verdict", page.locator("#f-verdict option").nth(1).get_attribute("value"))
    assert "verdict=" in page.url


def test_hostile_rows_render_as_text(page, server_url, web_db, tmp_path):
    page.goto(f"{server_url}/run/{quote(web_db.hostile, safe='')}")
    page.wait_for_selector("#rows-table tbody tr")
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#rows-table img, #reasons img, main script").count() == 0
    note = page.locator("#rows-table tbody tr").first.locator("td.msg").inner_text()
    assert "<script>window.__pwned=1</script>" in note and "[/red]" in note and "\x1b" not in note
    reason = page.locator("#reasons td.msg").first.inner_text()
    assert "<img src=x" in reason
    assert "window.__pwned=3" in page.locator("dl.runinfo").inner_text()    # the testlist, as text
    page.goto(f"{server_url}/case/{quote(web_db.hostile, safe='')}/0")
    assert "<script>window.__pwned=1</script>" in page.locator("#case-message").inner_text()
    page.goto(f"{server_url}/shape?runs={quote(web_db.hostile, safe='')}&by=role")
    page.wait_for_selector("#plot-latency[data-drawn='1']")
    assert page.evaluate("window.__pwned") is None


def test_static_site_from_disk(page, static_site, web_db, tmp_path):
    page.goto((static_site / "index.html").as_uri())
    assert page.locator("#runs-table tbody tr").count() == 3
    page.click(f"a.run-link:text-is('{web_db.run_a}')")
    assert page.url.endswith(f"run-{web_db.run_a}.html")
    page.select_option("#f-status", "ok")                    # filters work from file:// too
    assert page.locator("#rows-table tbody tr").count() == len(_ok_rows(web_db))
    page.click("#rows-table tbody tr a.case-link")
    row = _ok_rows(web_db)[0]
    assert f"case={row['case_index']}" in page.url
    assert _points(page, "plot-samples") == len(row["metrics"]["samples_us"])
    page.goto((static_site / f"roofline-{web_db.run_a}.html").as_uri())
    assert _points(page, "plot-roofline") == len(_ok_rows(web_db))
    assert page.locator("#plot-roofline .scatterlayer .point").count() == len(_ok_rows(web_db))
    page.goto((static_site / "shape.html").as_uri())
    assert _points(page, "plot-latency") > 0
    page.goto((static_site / f"compare-{web_db.run_a}--{web_db.run_b}.html").as_uri())
    assert _points(page, "plot-ratio") == len(_ok_rows(web_db))
    hostile = next(static_site.glob("run-hostile*.html"))
    page.goto(hostile.as_uri())
    page.wait_for_selector("#rows-table tbody tr")
    assert page.evaluate("window.__pwned") is None


def test_a_rank_local_row_says_so_on_the_run_and_case_pages(page, tmp_path, write_testlist):
    """A --rank-local run's row reads as one rank's shard: its label on the Run page, the rule and the
    shard's args on the Case page."""
    from operatorx.measure import TimingSettings
    from operatorx.run import RunConfig, run_testlist
    from operatorx.web import Queries
    from operatorx.web.site import build_site

    case = {"type": "gemm", "sources": ["org/model/mlp.down_proj"],
            "args": {"m": 2, "n": 128, "k": 256, "a": {"dtype": "bf16"}, "b": {"dtype": "bf16"}, "parallel": {"tp": 4}}}
    fast = TimingSettings(warmup_calls=1, warmup_floor_s=0, first_warmup_floor_s=0, min_samples=3, max_samples=5,
                          max_time_s=0)
    outcome = run_testlist(RunConfig(testlist=str(write_testlist([case])), device="cpu", db=str(tmp_path / "r.db"),
                                     results_dir=tmp_path / "res", timing=fast, executor="inline", rank_local=True))
    assert outcome.rows[0].status == "ok"
    site = tmp_path / "site"
    build_site(Queries.open(str(tmp_path / "r.db")), site)
    page.goto((site / f"run-{outcome.run_id}.html").as_uri())
    page.wait_for_selector("#rows-table tbody tr")
    assert "gemm 2x128x256 tp4 [rank-local 0/4]" in page.locator("#rows-table tbody tr").first.inner_text()
    page.click("#rows-table tbody tr a.case-link")
    text = page.locator("#case-rank-local").inner_text()
    assert "rank 0 of 4 (tp4)" in text and "row-parallel by role mlp.down_proj: k 256 -> 64" in text


def test_static_vs_previous_links_open_each_pairs_own_page(page, tmp_path):
    """`p--q`/`r` and `p`/`q--r` once shared a compare file: from disk, each link opens its own pair."""
    from operatorx.store import Store
    from operatorx.web import Queries
    from operatorx.web.site import build_site
    from tests.store.conftest import done, planned

    db = str(tmp_path / "pairs.db")
    store = Store(db)
    for n, rid in enumerate(("p--q", "r", "p", "q--r")):
        store.begin_run(rid, f"2026-12-0{n + 1}T00:00:00+00:00", "t", "torch", "cpu", {}, planned(2))
        for i in range(2):
            store.put_row(rid, done(i, latency_us=10.0 * (n + 1) + i))
        store.finish_run(rid, f"2026-12-0{n + 1}T01:00:00+00:00")
    store.close()
    site = build_site(Queries.open(db), tmp_path / "site", compare="previous", workers=1)
    assert site.compares == 3
    for a, b in (("p--q", "r"), ("p", "q--r"), ("r", "p")):
        page.goto((site.directory / "index.html").as_uri())
        row = page.locator("#runs-table tbody tr", has=page.locator(f"a.run-link:text-is('{b}')"))
        row.locator("a.cmp-prev").click()
        page.wait_for_load_state()
        got = page.evaluate("JSON.parse(document.getElementById('ox-data').textContent)")
        assert (got["a"]["id"], got["b"]["id"]) == (a, b), page.url
        base = {"p--q": 10.0, "r": 20.0, "p": 30.0, "q--r": 40.0}
        assert [c["a_latency_us"] for c in got["cases"]] == [base[a], base[a] + 1]
        assert [c["b_latency_us"] for c in got["cases"]] == [base[b], base[b] + 1]
