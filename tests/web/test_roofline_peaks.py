"""The Roofline page draws the GPU's measured ceilings where the rows carry them, the datasheet's
dotted beside; rows with datasheet peaks alone draw as before."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from operatorx.store import Store
from operatorx.web import Queries
from operatorx.web.app import create_app
from tests.web.conftest import WebDb, _store_copy, page_data, watched_page

SOURCE = "measured 2026-11-30 on this GPU (operatorx calibrate v1); datasheet beside: vendor datasheet, dense"


def _measured(row: dict[str, Any]) -> dict[str, Any]:
    row = json.loads(json.dumps(row))
    m = row.get("metrics") or {}
    if isinstance(m.get("tflops"), (int, float)):
        m["peak"] = {"compute_class": "bf16", "tflops": 1.0, "memory_gbps": 50.0, "measured_tflops": 0.8,
                     "measured_memory_gbps": 40.0, "source": SOURCE}
        m["pct_peak"] = 100 * max(m["tflops"] / 0.8, m["gbps"] / 40.0)
        m["pct_datasheet"] = 100 * max(m["tflops"] / 1.0, m["gbps"] / 50.0)
    return row


MIXED_SOURCE = ("memory measured 2026-11-30 on this GPU (operatorx calibrate v2); "
                "compute: vendor datasheet, dense")


def _mixed(row: dict[str, Any], i: int) -> dict[str, Any]:
    """Measured bf16 rows, and fp16 rows whose memory peak is measured but whose compute peak is the
    datasheet's (the calibration measures bf16 and fp8 only): the last row is an fp16 one."""
    row = _measured(row)
    peak = (row.get("metrics") or {}).get("peak")
    if peak is not None and i % 2 == 1:
        peak.update({"compute_class": "fp16", "tflops": 2.0, "measured_tflops": None, "source": MIXED_SOURCE})
    return row


@pytest.fixture(scope="module")
def measured_db(web_db: WebDb, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A copy of the web database with two more runs: one whose rows carry measured peaks, one whose
    bf16 rows do and whose fp16 rows have a measured memory peak only (`<run>-mixed`)."""
    path = tmp_path_factory.mktemp("measured") / "results.db"
    shutil.copy(web_db.path, path)
    store = Store(str(path))
    run = web_db.run_a + "-measured"
    _store_copy(store, web_db.doc_a, run, "2030-01-01T00:00:00+00:00", web_db.doc_a["run"]["testlist"],
                [_measured(r) for r in web_db.doc_a["rows"]])
    rated = [i for i, r in enumerate(web_db.doc_a["rows"]) if isinstance((r.get("metrics") or {}).get("tflops"),
                                                                            (int, float))]
    assert len(rated) >= 2, "the web database needs two rows with rates"
    order = {i: n for n, i in enumerate(rated)}
    last = rated[-1] if order[rated[-1]] % 2 == 1 else rated[-2]      # rows after it: bf16 would be last
    rows = [_mixed(r, order.get(i, 0)) for i, r in enumerate(web_db.doc_a["rows"]) if i <= last]
    _store_copy(store, web_db.doc_a, run.replace("-measured", "-mixed"), "2030-01-02T00:00:00+00:00",
                web_db.doc_a["run"]["testlist"], rows)
    store.close()
    return path, run


def test_roofline_uses_measured_ceilings_with_the_datasheet_beside(measured_db):
    path, run = measured_db
    page = Queries.open(str(path)).roofline(run)
    assert page.compute_tflops == {"bf16": 0.8} and page.memory_gbps == 40.0 and page.peak_source == SOURCE
    assert page.datasheet_tflops == {"bf16": 1.0} and page.datasheet_memory_gbps == 50.0
    html = TestClient(create_app(Queries.open(str(path)))).get(f"/roofline/{run}").text
    data = page_data(html)
    assert data["compute_tflops"] == {"bf16": 0.8} and data["datasheet_tflops"] == {"bf16": 1.0}
    assert data["memory_gbps"] == 40.0 and data["datasheet_memory_gbps"] == 50.0
    assert "(dashed; the datasheet's dotted)" in html
    assert page.compute_measured == {"bf16": True} and page.memory_measured is True
    assert data["compute_measured"] == {"bf16": True} and data["memory_measured"] is True


def test_roofline_says_per_class_which_ceiling_is_measured(measured_db):
    """A row whose memory peak is measured but whose class's compute peak is the datasheet's (fp16):
    its ceiling must not be called measured for its compute, whatever the last row's source says."""
    path, run = measured_db
    mixed = run.replace("-measured", "-mixed")
    page = Queries.open(str(path)).roofline(mixed)
    assert page.compute_tflops == {"bf16": 0.8, "fp16": 2.0} and page.memory_gbps == 40.0
    assert page.compute_measured == {"bf16": True, "fp16": False} and page.memory_measured is True
    assert page.peak_source == MIXED_SOURCE         # the last row is fp16: its source has "measured" in it
    data = page_data(TestClient(create_app(Queries.open(str(path)))).get(f"/roofline/{mixed}").text)
    assert data["compute_measured"] == {"bf16": True, "fp16": False} and data["memory_measured"] is True


def test_datasheet_only_rows_draw_one_ceiling(web_db):
    page = Queries.open(str(web_db.path)).roofline(web_db.run_b)
    assert page.compute_tflops == {"bf16": 1.0} and page.memory_gbps == 50.0
    assert page.datasheet_tflops == {} and page.datasheet_memory_gbps is None
    assert page.compute_measured == {"bf16": False} and page.memory_measured is False


@pytest.fixture
def browser_page(browser: Any) -> Iterator[Any]:
    with watched_page(browser) as pg:
        yield pg


def _roofline_trace_names(db_path, browser_page, tmp_path, page_word: str) -> list[str]:
    """The trace names of the built site's roofline page whose file name holds `page_word`."""
    from operatorx.web.site import build_site

    build_site(Queries.open(str(db_path)), tmp_path / "site")
    page = next(p for p in (tmp_path / "site").glob("roofline-*.html") if page_word in p.name)
    browser_page.goto(page.as_uri())
    browser_page.wait_for_selector("#plot-roofline[data-drawn='1']", timeout=15000)
    return browser_page.evaluate("document.getElementById('plot-roofline').data.map(t => t.name)")


def test_roofline_page_draws_measured_and_datasheet_ceilings(measured_db, browser_page, tmp_path):
    names = _roofline_trace_names(measured_db[0], browser_page, tmp_path, "measured")
    assert "bf16 ceiling (measured) 1 TFLOP/s, 40 GB/s" in names, names
    assert "bf16 datasheet 1 TFLOP/s, 50 GB/s" in names, names
    assert browser_page.locator("#plot-roofline .scatterlayer .trace").count() == 3   # points, measured, datasheet


def test_roofline_page_labels_each_ceiling_by_what_was_measured(measured_db, browser_page, tmp_path):
    names = _roofline_trace_names(measured_db[0], browser_page, tmp_path, "mixed")
    assert "bf16 ceiling (measured) 1 TFLOP/s, 40 GB/s" in names, names
    assert "fp16 ceiling (memory measured) 2 TFLOP/s, 40 GB/s" in names, names     # its compute: the datasheet's
    assert not any(n.startswith("fp16 ceiling (measured)") for n in names), names
