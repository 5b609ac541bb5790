"""The dashboard without a browser: every page over a real CPU run (Starlette's TestClient), the static
build, escaping of hostile rows, the read-only connection, and one-line errors for a bad --db."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy import text
from starlette.testclient import TestClient

from operatorx.web import Queries, WebError, open_store
from operatorx.web.app import create_app
from operatorx.web.safe import clean, clean_text, script_json
from tests.web.conftest import HOSTILE_MESSAGE, WebDb, page_data


@pytest.fixture(scope="module")
def client(web_db: WebDb) -> TestClient:
    return TestClient(create_app(Queries.open(str(web_db.path))))


_data = page_data


def test_runs_page_lists_every_run_with_counts(client, web_db):
    r = client.get("/")
    assert r.status_code == 200 and "script-src 'self'" in r.headers["content-security-policy"]
    runs = {x["id"]: x for x in _data(r.text)["runs"]}
    assert set(runs) == {web_db.run_a, web_db.run_b, web_db.hostile}
    statuses = [row["status"] for row in web_db.doc_a["rows"]]
    assert runs[web_db.run_a]["counts"] == {s: statuses.count(s) for s in ("ok", "unsupported", "error", "missing")}
    assert runs[web_db.run_b]["previous"] == web_db.run_a        # the Runs page's "vs previous" link


def test_run_page_rows_reasons_and_links(client, web_db):
    r = client.get(f"/run/{web_db.run_a}")
    assert r.status_code == 200
    data = _data(r.text)
    assert [x["index"] for x in data["rows"]] == [row["case_index"] for row in web_db.doc_a["rows"]]
    ok = [x for x in data["rows"] if x["status"] == "ok"]
    assert ok and all(x["latency_us"] and x["tflops"] and x["m"] for x in ok)
    assert all(x["models"] == ["deepseek-ai/DeepSeek-V3"] for x in data["rows"])
    unsupported = [x for x in data["rows"] if x["status"] == "unsupported"]
    assert unsupported and "cpu_max_gflop" in r.text                 # the reasons table, grouped
    assert f'href="/roofline/{web_db.run_a}"' in r.text
    assert "timing host_clock" in r.text and "L2 " not in r.text.split("timing host_clock", 1)[1][:20]
    assert [m["key"] for m in data["metrics"]] == ["latency_us", "tflops", "gbps", "pct_peak"]   # shown.py


def test_prefix_and_latest_resolve_and_unknown_run_is_404(client, web_db):
    assert client.get("/run/latest").status_code == 200
    r = client.get("/run/nope-nope")
    assert r.status_code == 404 and "no run" in r.text


def test_shape_roofline_case_pages(client, web_db):
    shape = _data(client.get(f"/shape?runs={web_db.run_a},{web_db.run_b}").text)
    assert [s["run"]["id"] for s in shape["series"]] == [web_db.run_a, web_db.run_b]
    ok = [row for row in web_db.doc_a["rows"] if row["status"] == "ok"]
    assert len(shape["series"][0]["rows"]) == len(ok)
    roof = _data(client.get(f"/roofline/{web_db.run_a}").text)
    assert len(roof["points"]) == len(ok) and roof["memory_gbps"] is None        # CPU: no datasheet peak
    first = ok[0]
    case = _data(client.get(f"/case/{web_db.run_a}/{first['case_index']}").text)["case"]
    assert case["metrics"]["samples_us"] == first["metrics"]["samples_us"]
    assert client.get(f"/case/{web_db.run_a}/999").status_code == 404


def test_compare_page(client, web_db):
    r = client.get(f"/compare?a={web_db.run_a}&b={web_db.run_b}")
    assert r.status_code == 200
    data = _data(r.text)
    ok = [row for row in web_db.doc_a["rows"] if row["status"] == "ok"]
    measured = [c for c in data["cases"] if c["ratio"] is not None]
    assert len(measured) == len(ok)
    assert all(abs(c["ratio"] - 1.25) < 0.01 for c in measured)
    assert all(c["m"] is not None and c["index_b"] is not None for c in measured)
    assert client.get("/compare").status_code == 200                 # the picker


def test_hostile_strings_are_text(client, web_db):
    h = quote(web_db.hostile, safe="")
    responses = [client.get(u) for u in ("/", f"/run/{h}", f"/case/{h}/0", f"/roofline/{h}", f"/shape?runs={h}")]
    assert [r.status_code for r in responses] == [200] * 5
    pages = [r.text for r in responses]
    for html in pages:
        assert "<script>window.__pwned" not in html and "<img src=x" not in html
        assert "\x1b" not in html
        # the only <script> elements are the page's own: its data and its scripts from /static
        for tag in re.findall(r"<script[^>]*>", html):
            assert tag == '<script type="application/json" id="ox-data">' or 'src="/static/' in tag, tag
    run_html = pages[1]
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in run_html            # Jinja: escaped text
    assert "[/red]" in run_html and "red alert" in run_html                       # ANSI gone, markup kept as text
    data = _data(run_html)
    assert data["rows"][0]["message"] == clean_text(HOSTILE_MESSAGE)
    assert data["run"]["testlist"].startswith("</script>")                        # survives JSON.parse intact


def test_script_json_and_clean():
    s = script_json({"m": "</script><!-- & \u2028", "x": [1.5, 2]})
    assert "<" not in s and ">" not in s and "&" not in s and "\u2028" not in s
    assert json.loads(str(s)) == {"m": "</script><!-- & \u2028", "x": [1.5, 2]}
    assert clean_text("\x1b[1;31mred\x1b[0m \x1b]8;;http://x\x07link\x1b]8;;\x07 a\x00b\tc\n") == "red link ab\tc\n"
    assert clean({"k\x1b[0m": [float("nan"), "a\x07"], "n": [1.0, 2.0], "i": float("inf")}) == \
        {"k": [None, "a"], "n": [1.0, 2.0], "i": None}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_connection_is_read_only(web_db):
    before = _digest(web_db.path)
    store = open_store(str(web_db.path))
    with pytest.raises(Exception, match="(?i)readonly|read-only|read only"):
        with store.engine.begin() as conn:
            conn.execute(text("CREATE TABLE web_was_here (x INTEGER)"))
    assert Queries(store).runs()
    store.engine.dispose()
    assert _digest(web_db.path) == before


def test_missing_database_is_one_line_and_not_created(tmp_path):
    db = tmp_path / "none.db"
    with pytest.raises(WebError, match="no database at"):
        open_store(str(db))
    assert not db.exists()
    for args in (["serve", "--db", str(db), "--port", "0"], ["report", "build", "--db", str(db), "-o",
                                                                str(tmp_path / "site")]):
        done = subprocess.run([sys.executable, "-m", "operatorx", *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert done.stderr.strip().startswith("error: ") and len(done.stderr.strip().splitlines()) == 1
    assert not db.exists() and not (tmp_path / "site").exists()


def test_not_a_database(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_text("hello")
    with pytest.raises(WebError, match="not an SQLite database"):
        open_store(str(bad))


def test_static_site_is_self_contained(static_site, web_db):
    index = (static_site / "index.html").read_text()
    assert 'src="static/plotly.min.js"' not in index                    # no plot on the Runs page
    names = {p.name for p in static_site.iterdir()}
    for run in (web_db.run_a, web_db.run_b):
        assert {f"run-{run}.html", f"roofline-{run}.html", f"case-{run}.html"} <= names
    assert (static_site / "static" / "plotly.min.js").stat().st_size > 1_000_000
    assert f"compare-{web_db.run_a}--{web_db.run_b}.html" in names
    for page in static_site.glob("*.html"):
        html = page.read_text()
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", html), page.name   # no CDN, nothing remote
        assert "<script>window.__pwned" not in html
    hostile = [p for p in names if p.startswith("run-hostile")]
    assert len(hostile) == 1 and "<" not in hostile[0]
    chunk = next((static_site / "data").glob(f"cases-{web_db.run_a}-0.js")).read_text()
    assert chunk.startswith("oxCaseChunk([")


def test_report_build_cli_replaces_only_its_own_site(web_db, tmp_path):
    out = tmp_path / "site"
    cmd = [sys.executable, "-m", "operatorx", "report", "build", "--db", str(web_db.path), "-o", str(out),
           "--runs", f"{web_db.run_a},{web_db.run_b}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "2 runs" in done.stdout and (out / "index.html").is_file()
    assert subprocess.run(cmd, capture_output=True, text=True, timeout=300).returncode == 0    # rebuild in place
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    cmd[cmd.index(str(out))] = str(other)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "not a site" in done.stderr
    assert (other / "notes.txt").read_text() == "keep"


def test_database_file_untouched_by_serving(web_db, client):
    before = _digest(web_db.path)
    for u in ("/", f"/run/{web_db.run_a}", f"/compare?a={web_db.run_a}&b={web_db.run_b}"):
        client.get(u)
    assert _digest(web_db.path) == before
    con = sqlite3.connect(f"file:{web_db.path}?mode=ro", uri=True)
    names = {r[0] for r in con.execute("select name from sqlite_master where type = 'table'")}
    con.close()
    assert "web_was_here" not in names


def test_report_build_compare_choices(web_db, tmp_path):
    out = tmp_path / "pairs"
    base = [sys.executable, "-m", "operatorx", "report", "build", "--db", str(web_db.path), "-o", str(out)]
    done = subprocess.run([*base, "--runs", web_db.run_a, "--compare", f"{web_db.run_a}:{web_db.run_b}"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (out / f"run-{web_db.run_b}.html").is_file()              # a compared run comes along
    assert (out / f"compare-{web_db.run_a}--{web_db.run_b}.html").is_file()
    assert f'href="compare-{web_db.run_a}--{web_db.run_b}.html"' in (out / "index.html").read_text()
    done = subprocess.run([*base, "--compare", "sideways"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--compare sideways" in done.stderr and "Traceback" not in done.stderr


def test_build_in_one_process_matches_workers(web_db, tmp_path):
    from operatorx.web.site import build_site

    one = build_site(Queries.open(str(web_db.path)), tmp_path / "one", workers=1, compare="none")
    two = build_site(Queries.open(str(web_db.path)), tmp_path / "two", workers=2, compare="none")
    assert one.pages == two.pages
    files = sorted(p.relative_to(one.directory) for p in one.directory.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(two.directory) for p in two.directory.rglob("*") if p.is_file())
    for f in files:
        assert (one.directory / f).read_bytes() == (two.directory / f).read_bytes(), f


def test_serve_command_serves_and_refuses_a_busy_port(web_db):
    import time
    import urllib.request

    from tests.web.conftest import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "operatorx", "serve", "--db", str(web_db.path), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                    assert r.status == 200 and web_db.run_a in r.read().decode()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.2)
        busy = subprocess.run([sys.executable, "-m", "operatorx", "serve", "--db", str(web_db.path), "--port",
                               str(port)], capture_output=True, text=True, timeout=120)
        assert busy.returncode == 2 and "cannot listen on 127.0.0.1" in busy.stderr and "Traceback" not in busy.stderr
    finally:
        proc.terminate()
        proc.wait(20)


def test_empty_database_and_odd_documents(tmp_path):
    from operatorx.store import Store

    db = tmp_path / "empty.db"
    Store(str(db)).close()
    client = TestClient(create_app(Queries.open(str(db))))
    for url in ("/", "/shape", "/compare"):
        assert client.get(url).status_code == 200, url
    assert client.get("/run/latest").status_code == 404
    store = Store(str(db))                   # a run whose info holds the wrong types still shows
    store.begin_run("odd", "2026-11-30T00:00:00+00:00", "t", "torch", "cpu",
                    {"software": "not a mapping", "timing": [1], "git_sha": 7}, [])
    store.close()
    r = client.get("/run/odd")
    assert r.status_code == 200 and _data(r.text)["rows"] == []
