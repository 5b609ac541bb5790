"""A results database made by a real CPU run, plus a second run derived from it (B, 25% slower, at
another git commit: the Compare page's other side, and the pair `report build` compares by default) and
a hostile run (markup, script, ANSI and Rich markup in its strings), both written through the Store API.
Built once per test session."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from operatorx.result import Row
from operatorx.store import Store

HOSTILE_MESSAGE = ("<script>window.__pwned=1</script><img src=x onerror=\"window.__pwned=2\">"
                   "\x1b[31mred alert\x1b[0m [/red] [bold]x[/bold] </script><!--")
HOSTILE_TESTLIST = "</script><script>window.__pwned=3</script>"
HOSTILE_SOURCE = "<img src=x onerror=window.__pwned=4>/role<b>"
GIT_A, GIT_B = "a" * 40, "b" * 40          # the commits run A and run B say they ran at


@dataclass(frozen=True)
class WebDb:
    path: Path
    run_a: str          # the real CPU run
    run_b: str          # derived from it: every latency 25% higher, a made-up peak
    hostile: str
    doc_a: dict[str, Any]


def _store_copy(store: Store, doc: dict[str, Any], run_id: str, started_at: str, testlist: str,
                rows: list[dict[str, Any]]) -> None:
    run = doc["run"]
    info = {k: v for k, v in run.items() if k not in ("id", "started_at", "finished_at", "state", "testlist",
                                                       "backend")}
    planned = [Row.from_json(r) for r in rows]
    store.begin_run(run_id, started_at, testlist, run["backend"], "cpu", info,
                    [Row.missing(r.case, r.backend, testlist, r.case_index) for r in planned])
    for r in planned:
        store.put_row(run_id, r)
    store.finish_run(run_id, (datetime.fromisoformat(started_at) + timedelta(minutes=30)).isoformat(timespec="seconds"))


def _slower(row: dict[str, Any], factor: float) -> dict[str, Any]:
    row = json.loads(json.dumps(row))
    m = row.get("metrics") or {}
    for key in ("latency_us",):
        if isinstance(m.get(key), (int, float)):
            m[key] *= factor
    if m.get("samples_us"):
        m["samples_us"] = [s * factor for s in m["samples_us"]]
    for key in ("tflops", "gbps"):
        if isinstance(m.get(key), (int, float)):
            m[key] /= factor
    if isinstance(m.get("tflops"), (int, float)):      # as if on a GPU: a datasheet peak, readings, kernels
        m["peak"] = {"compute_class": "bf16", "tflops": 1.0, "memory_gbps": 50.0, "source": "test peak"}
        m["pct_peak"] = 100 * max(m["tflops"] / 1.0, m["gbps"] / 50.0)
        m["telemetry"] = {**m.get("telemetry", {}), "available": True,
                          "sm_clock_mhz": {"min": 1965, "p50": 1980, "max": 1980},
                          "power_w": {"min": 300.0, "p50": 420.0, "max": 560.0},
                          "temperature_c": {"min": 40.0, "p50": 44.0, "max": 47.0}}
        lat = m["latency_us"]
        m["profile"] = {"calls": 8, "span_us_median": lat, "busy_us_median": lat * 0.97, "kernels": [
            {"name": "sm90_xmma_gemm_bf16bf16_bf16f32", "count_per_call": 1.0, "device_us_per_call": lat * 0.9,
             "device_us_median": lat * 0.9},
            {"name": "<b>kernel</b>", "count_per_call": 1.0, "device_us_per_call": lat * 0.07,
             "device_us_median": lat * 0.07}]}
        m["timing"] = {**(m.get("timing") or {}), "launch_gap_us": 1.104}     # its worker's launch-gap level
    if isinstance(m.get("summary_us"), dict):
        m["summary_us"] = {k: (v * factor if k not in ("n", "cv", "median_noise") and isinstance(v, (int, float))
                               else v) for k, v in m["summary_us"].items()}
    return row


def _hostile(row: dict[str, Any]) -> dict[str, Any]:
    row = json.loads(json.dumps(row))
    row["op"]["sources"] = [HOSTILE_SOURCE]
    if row["case_index"] == 0:
        return {**row, "status": "error", "error_kind": "exception", "message": HOSTILE_MESSAGE,
                "metrics": {"scheme": row["metrics"].get("scheme")}}
    return {**row, "message": HOSTILE_MESSAGE if row["status"] != "ok" else None}


@pytest.fixture(scope="session")
def web_db(tmp_path_factory: pytest.TempPathFactory) -> WebDb:
    tmp = tmp_path_factory.mktemp("web")
    db = tmp / "results.db"
    cmd = [sys.executable, "-m", "operatorx", "run", "-t", "gemm_perf", "--device", "cpu", "--limit", "6",
           "--max-time", "0.05", "--min-samples", "5", "--warmup-calls", "1", "--executor", "inline",
           "--db", str(db), "--results-dir", str(tmp / "docs")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OPERATORX_GIT_SHA": GIT_A})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    store = Store(str(db))
    doc_a = store.document("latest")
    run_a = doc_a["run"]["id"]
    run_b = run_a + "-b"
    later = (datetime.fromisoformat(doc_a["run"]["started_at"]) + timedelta(hours=1)).isoformat(timespec="seconds")
    _store_copy(store, {**doc_a, "run": {**doc_a["run"], "git_sha": GIT_B}}, run_b, later, doc_a["run"]["testlist"],
                [_slower(r, 1.25) for r in doc_a["rows"]])
    hostile = "hostile-<b>run</b>"
    _store_copy(store, doc_a, hostile, "2000-01-01T00:00:00+00:00", HOSTILE_TESTLIST,
                [_hostile(r) for r in doc_a["rows"]])
    store.close()
    return WebDb(path=db, run_a=run_a, run_b=run_b, hostile=hostile, doc_a=doc_a)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(db_path: str) -> Iterator[str]:
    """The dashboard over `db_path` served by uvicorn in a thread on 127.0.0.1, a free port: its URL."""
    import uvicorn

    from operatorx.web import Queries
    from operatorx.web.app import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(Queries.open(db_path)), host="127.0.0.1",
                                           port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="session")
def server_url(web_db: WebDb) -> Iterator[str]:
    """The dashboard of the shared test database, served for the session."""
    with serving(str(web_db.path)) as url:
        yield url


@pytest.fixture(scope="session")
def static_site(web_db: WebDb, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from operatorx.web import Queries
    from operatorx.web.site import build_site

    out = tmp_path_factory.mktemp("site") / "site"
    build_site(Queries.open(str(web_db.path)), out)
    return out


def page_data(html: str) -> dict[str, Any]:
    """The data a page renders from (its `ox-data` script element)."""
    m = re.search(r'<script type="application/json" id="ox-data">(.*?)</script>', html, re.S)
    assert m, "page without its data"
    return json.loads(m.group(1))  # type: ignore[no-any-return]


def chromium_path() -> str | None:
    for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if Path(p).is_file():
            return p
    return shutil.which("chromium")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium per test module (Debian's, driven by Playwright); skips without either."""
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright is not installed (pip install -e '.[dev]')")
    path = chromium_path()
    if path is None:
        pytest.skip("no Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@contextmanager
def watched_page(browser: Any, width: int = 1400, height: int = 900) -> Iterator[Any]:
    """A page that fails the test on any script error, console error or dialog (an alert is an exploit)."""
    ctx = browser.new_context(viewport={"width": width, "height": height})
    pg = ctx.new_page()
    problems: list[str] = []
    pg.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    pg.on("console", lambda m: problems.append(f"console: {m.text}") if m.type == "error" else None)
    pg.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    yield pg
    ctx.close()
    assert not problems, problems
