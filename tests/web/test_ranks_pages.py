"""A multi-rank row (`metrics.ranks`) on the dashboard: the Run page's world and skew columns (blank on
single-rank rows), the Case page's line per rank and how the ranks were timed, and the static site
built from the same page code. Over the server (page data), and once in Chromium from disk."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from operatorx.web import Queries
from operatorx.web.app import create_app
from tests.report.rows import RANK_BUSY_US, RANK_COLLECTIVE_US, RANK_KERNEL_TIMES, store_ranked_run
from tests.web.conftest import page_data, watched_page

RUN = "ranks-run"


@pytest.fixture(scope="module")
def ranks_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("ranksweb") / "ranks.db"
    store_ranked_run(str(db), RUN)
    return db


@pytest.fixture(scope="module")
def client(ranks_db: Path) -> TestClient:
    return TestClient(create_app(Queries.open(str(ranks_db))))


@pytest.fixture(scope="module")
def site(ranks_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from operatorx.web.site import build_site

    return build_site(Queries.open(str(ranks_db)), tmp_path_factory.mktemp("rankssite") / "site",
                      compare="none", workers=1).directory


def _views(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["index"], r["world"], r["split"], r["skew_us"] and round(r["skew_us"], 6)) for r in rows]


def test_the_run_page_has_world_and_skew_for_the_multi_rank_row_only(client):
    data = page_data(client.get(f"/run/{RUN}").text)
    # skew: the median over iterations of (slowest − fastest) = 1.8 µs; the single-rank rows have none
    assert _views(data["rows"]) == [(0, 2, "tp2", 1.8), (1, None, None, None), (2, None, None, None)]
    assert data["rows"][0]["latency_us"] == 43.0                  # the slowest rank's median


def _ranks_detail(case: dict[str, Any]) -> dict[str, Any]:
    ranks = case["metrics"]["ranks"]
    assert "ranks" not in case["other"]                            # a part the page shows, not `other metrics`
    return ranks  # type: ignore[no-any-return]


def test_the_case_page_has_a_line_per_rank_and_how_the_ranks_were_timed(client):
    case = page_data(client.get(f"/case/{RUN}/0").text)["case"]
    ranks = _ranks_detail(case)
    assert (ranks["world"], ranks["split"], ranks["latency_us_min"], ranks["capped_ranks"]) == (2, "tp2", 41.2, [1])
    assert ranks["skew_us"] == pytest.approx(1.8) and ranks["kernel_times"] == RANK_KERNEL_TIMES
    lines = [(p["rank"], p["gpu"], p["latency_us"], p["busy_us"], p["collective_us"], p["capped"],
              p["telemetry"]["sm_clock_mhz"]["p50"]) for p in ranks["per_rank"]]
    assert lines == [(0, "2", 41.2, RANK_BUSY_US[0], RANK_COLLECTIVE_US[0], False, 1980.0),
                     (1, "3", 43.0, RANK_BUSY_US[1], RANK_COLLECTIVE_US[1], True, 1755.0)]
    assert "clock capped on rank 1 of 2: sw_power_cap" in case["notes"]
    single = page_data(client.get(f"/case/{RUN}/1").text)["case"]
    assert "ranks" not in single["metrics"]


def test_the_static_site_carries_the_same_rows_and_case_data(client, site):
    run = page_data((site / f"run-{RUN}.html").read_text())
    assert _views(run["rows"]) == _views(page_data(client.get(f"/run/{RUN}").text)["rows"])
    chunk = (site / "data" / f"cases-{RUN}-0.js").read_text()
    cases = json.loads(re.search(r"\((\[.*\])\)", chunk, re.S).group(1))   # type: ignore[union-attr]
    served = page_data(client.get(f"/case/{RUN}/0").text)["case"]
    assert _ranks_detail(cases[0]) == _ranks_detail(served)


# --- in a browser ---------------------------------------------------------------------------------

@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    with watched_page(browser, 1600, 1000) as pg:
        yield pg


def test_browser_static_run_and_case_pages_show_the_ranks(page, site):
    page.goto((site / f"run-{RUN}.html").as_uri())
    page.wait_for_selector("#rows-table tbody tr")
    heads = page.locator("#rows-table thead th").all_inner_texts()
    assert heads.index("latency µs") < heads.index("world") < heads.index("skew µs")
    cells = [dict(zip(heads, tr.locator("td").all_inner_texts(), strict=True))
             for tr in page.locator("#rows-table tbody tr").all()]
    assert [(c["#"], c["world"], c["skew µs"]) for c in cells] == [("0", "2", "1.80"), ("1", "", ""), ("2", "", "")]
    page.goto((site / f"case-{RUN}.html").as_uri() + "?case=0")
    section = page.locator("section[data-section='Ranks']")
    section.wait_for()
    text = section.inner_text()
    assert "fastest rank µs (median)\n41.20" in text and "skew µs (median slowest − fastest)\n1.80" in text
    assert "capped ranks\n1" in text and RANK_KERNEL_TIMES in text
    lines = [tr.locator("td").all_inner_texts() for tr in page.locator("#rank-lines tbody tr").all()]
    assert [line[:7] for line in lines] == [["0", "2", "gpu2", "41.20", "38.60", "6.10", "false"],
                                            ["1", "3", "gpu3", "43", "40.25", "7.45", "true"]]
    assert [line[7] for line in lines] == ["1,980", "1,755"]     # SM MHz p50 (ox.js fmt: whole numbers bare)
    assert lines[1][-1] == "sw_power_cap" and lines[0][-1] == ""
