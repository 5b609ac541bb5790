"""The GPUs page (web/gpus.py) over runs planted in a real SQLite store: which runs it takes, the
speedups against each baseline, per-model geometric means, win counts and coverage, served (Starlette's
TestClient) and written by `report build`; and both it and the Case page's kernel timeline drawn from
disk in a real browser without a console error."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import pytest
from starlette.testclient import TestClient

from operatorx.result import Row
from operatorx.spec import Case
from operatorx.store import Store
from operatorx.web import Queries
from operatorx.web.app import create_app
from operatorx.web.site import build_site
from tests.conftest import gemm
from tests.web.conftest import page_data, watched_page

MODEL_A, MODEL_B = "org/model-a", "org/model-b"
SOURCES = {0: MODEL_A, 1: MODEL_A, 2: MODEL_B, 3: MODEL_B, 4: MODEL_A, 5: MODEL_B}
# per run, per case: a latency (ok), a status, or None (the run has no row for the case)
H100: dict[int, Any] = {0: 10.0, 1: 20.0, 2: 40.0, 3: "unsupported", 4: 30.0, 5: 7.0}
H200: dict[int, Any] = {0: 5.0, 1: 10.0, 2: 50.0, 3: 8.0, 4: "error", 5: 7.0}
B200: dict[int, Any] = {0: 2.5, 1: 20.0, 3: 4.0, 4: "missing", 5: 7.0}
KERNELS = [  # real names (docs/benchmarks.md), as measure/kernels.py stores them
    {"name": "void per_token_group_quant_8bit_kernel<c10::BFloat16, c10::Float8_e4m3fn>", "count_per_call": 1.0,
     "device_us_per_call": 1.5, "device_us_median": 1.5},
    {"name": "fused_moe_kernel", "count_per_call": 2.0, "device_us_per_call": 6.0, "device_us_median": 3.0},
    {"name": "Memset (Device)", "count_per_call": 1.0, "device_us_per_call": 0.5, "device_us_median": 0.5},
]


def _case(i: int) -> Case:
    return Case.model_validate({**gemm(m=i + 1), "sources": [f"{SOURCES[i]}/q_proj"]})


def _plant(store: Store, rid: str, day: int, gpu: str, cases: dict[int, Any], *, testlist: str = "fleet",
           kind: Optional[str] = None, shard: Optional[str] = None) -> None:
    info: dict[str, Any] = {"device": {"kind": "cuda", "name": gpu}, "software": {"torch": "2.13.0"}}
    if kind:
        info["kind"] = kind
    store.begin_run(rid, f"2026-11-{day:02d}T00:00:00+00:00", testlist, "torch", "cuda", info,
                    [Row.missing(_case(i), "torch", testlist, i) for i in sorted(cases)], shard=shard)
    for i, v in cases.items():
        if isinstance(v, float):
            metrics: dict[str, Any] = {"latency_us": v, "samples_us": [v] * 3, "scheme": "bf16"}
            if i == 0:
                metrics["profile"] = {"calls": 8, "span_us_median": 9.0, "busy_us_median": 8.0, "kernels": KERNELS}
            store.put_row(rid, Row(case=_case(i), backend="torch", status="ok", testlist=testlist, case_index=i,
                                   metrics=metrics))
        elif v in ("unsupported", "error"):
            store.put_row(rid, Row(case=_case(i), backend="torch", status=v, testlist=testlist, case_index=i,
                                   message="why", error_kind="exception" if v == "error" else None))
    store.finish_run(rid, f"2026-11-{day:02d}T01:00:00+00:00")


@pytest.fixture(scope="module")
def fleet_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """fleet on H100, H200 (and an older H200 run, an A/B run and a shard, all left out) and B200; a
    testlist run on one GPU only."""
    db = str(tmp_path_factory.mktemp("gpus") / "fleet.db")
    store = Store(db)
    _plant(store, "h200-old", 1, "NVIDIA H200", {i: 1.0 for i in range(6)})
    _plant(store, "h100", 2, "NVIDIA H100", H100)
    _plant(store, "h200", 3, "NVIDIA H200", H200)
    _plant(store, "b200", 4, "NVIDIA B200", B200)
    _plant(store, "ab", 5, "NVIDIA H100", {0: 1.0}, kind="ab")
    _plant(store, "shard", 6, "NVIDIA GB200", {0: 1.0}, shard="0/2")
    _plant(store, "solo", 7, "NVIDIA H100", {0: 1.0}, testlist="solo")
    store.close()
    return db


@pytest.fixture(scope="module")
def client(fleet_db: str) -> TestClient:
    return TestClient(create_app(Queries.open(fleet_db)))


def _check_numbers(data: dict[str, Any]) -> None:
    names = [r["run"]["id"] for r in data["runs"]]
    assert names == ["b200", "h100", "h200"]          # newest per GPU, by GPU name
    b200, h100, h200 = range(3)
    view = data["baselines"][h100]
    assert view["baseline"] == h100
    sp = view["speedups"]
    assert sp[0] == pytest.approx([4.0, 1.0, 2.0])
    assert sp[1] == pytest.approx([1.0, 1.0, 2.0])
    assert sp[2][b200] is None and sp[2][h200] == pytest.approx(0.8)
    assert sp[3] == [None, None, None]                 # the baseline did not run it
    assert sp[4] == [None, 1.0, None]
    models = {m["model"]: m for m in view["models"]}
    assert set(models) == {MODEL_A, MODEL_B}
    assert models[MODEL_A]["geomean"] == pytest.approx([2.0, 1.0, 2.0]) and models[MODEL_A]["cases"] == [2, 3, 2]
    assert models[MODEL_B]["geomean"] == pytest.approx([1.0, 1.0, math.sqrt(0.8)])
    assert models[MODEL_B]["cases"] == [1, 2, 2]
    assert view["overall"]["geomean"] == pytest.approx([4 ** (1 / 3), 1.0, 3.2 ** 0.25])
    assert (view["faster"], view["slower"], view["equal"]) == ([1, 0, 2], [0, 0, 1], [2, 5, 1])
    # against B200 instead: the same latencies, the other way round
    other = data["baselines"][b200]["speedups"]
    assert other[0] == pytest.approx([1.0, 0.25, 0.5]) and other[3] == pytest.approx([1.0, None, 0.5])
    assert data["wins"] == [2, 1, 1] and data["contested"] == 5 and data["ties"] == 1
    assert [c["winner"] for c in data["cases"]] == [b200, h200, h100, b200, None, None]
    assert [c["counts"] for c in data["coverage"]] == [
        {"ok": 4, "unsupported": 0, "error": 0, "missing": 2},
        {"ok": 5, "unsupported": 1, "error": 0, "missing": 0},
        {"ok": 5, "unsupported": 0, "error": 1, "missing": 0}]
    assert [c["absent"] for c in data["coverage"]] == [1, 0, 0]
    assert data["cases"][2]["status"] == ["absent", "ok", "ok"]


def test_gpus_page_numbers_served(client):
    r = client.get("/gpus/fleet")
    assert r.status_code == 200
    _check_numbers(page_data(r.text))


def test_gpus_index_lists_testlists_on_two_gpus(client):
    r = client.get("/")
    assert 'href="/gpus"' in r.text                    # from the Runs page
    index = page_data(client.get("/gpus").text)
    assert [(t["testlist"], t["runs"], t["href"]) for t in index["testlists"]] == [
        ("fleet", ["b200", "h100", "h200"], "/gpus/fleet")]


def test_gpus_page_named_runs_and_bad_ones(client):
    data = page_data(client.get("/gpus/fleet?runs=h200-old,h100").text)
    assert [r["run"]["id"] for r in data["runs"]] == ["h200-old", "h100"]
    assert data["baselines"][1]["speedups"][0] == pytest.approx([10.0, 1.0])
    assert client.get("/gpus/fleet?runs=solo").status_code == 404        # not a run of the testlist
    assert client.get("/gpus/nothing").status_code == 404
    assert client.get("/gpus/fleet?runs=" + ",".join(["h100"] * 17)).status_code == 400


def test_case_page_kernel_timeline(client):
    tl = page_data(client.get("/case/h100/0").text)["case"]["kernel_timeline"]
    assert [(b["kernel_class"], b["start_us"], b["duration_us"]) for b in tl["bars"]] == [
        ("quantize", 0.0, 1.5), ("expert_gemm", 1.5, 6.0), ("memory", 7.5, 0.5)]
    assert tl["total_us"] == 8.0 and "gaps" in tl["basis"]
    assert page_data(client.get("/case/h100/1").text)["case"]["kernel_timeline"] is None   # no profile


@pytest.fixture(scope="module")
def site(fleet_db: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    summary = build_site(Queries.open(fleet_db), tmp_path_factory.mktemp("site") / "site", workers=1)
    assert summary.gpu_pages == 1 and not summary.skipped
    return summary.directory


def test_report_build_writes_the_gpus_pages(site):
    _check_numbers(page_data((site / "gpus-fleet.html").read_text(encoding="utf-8")))
    index = page_data((site / "gpus.html").read_text(encoding="utf-8"))
    assert [t["href"] for t in index["testlists"]] == ["gpus-fleet.html"]
    assert 'href="gpus.html"' in (site / "index.html").read_text(encoding="utf-8")


def test_both_views_in_a_browser_from_disk(browser, site):
    with watched_page(browser, 1400, 900) as pg:
        pg.goto((site / "index.html").as_uri())
        pg.click("nav a:text-is('GPUs')")
        pg.click("#gpu-testlists a.gpus-link")
        pg.wait_for_selector("#plot-models[data-drawn='1']")
        assert pg.get_attribute("#plot-models", "data-points") == "4"    # B200, H200 × two models
        assert pg.locator("#plot-models .bars .point").count() == 4
        rows = pg.locator("#gpu-runs tbody tr")
        assert rows.count() == 3
        assert pg.inner_text("#gpu-runs tbody tr[data-run='h200'] td[data-key='wins']") == "1"
        pg.select_option("#f-baseline", "h100")
        assert "baseline=h100" in pg.url
        assert pg.inner_text("#gpu-runs tbody tr[data-run='h200'] td[data-key='geomean']") == "1.337×"
        pg.goto((site / "case-h100.html").as_uri() + "?case=0")
        pg.wait_for_selector("#plot-kernels[data-drawn='1']")
        assert pg.get_attribute("#plot-kernels", "data-points") == "3"
        assert pg.locator("#plot-kernels .bars .point").count() == 3
        assert "gaps between kernels" in pg.inner_text("#kernel-timeline-basis")
