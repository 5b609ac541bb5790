"""The static site with odd run ids and odd directories, against real SQLite and PostgreSQL:

- a run id holding ESC (and one of bidi overrides, one 300 characters long) is shown, linked and
  filed under a safe name, and a run whose stored rows cannot be rendered is skipped with one line,
  never failing the build;
- compare pages have one file per run pair (`p--q`/`r` and `p`/`q--r` no longer share one);
- `report build -o DIR` replaces DIR only when every file in it is one its last build wrote.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy import text
from starlette.testclient import TestClient

from operatorx.store import Store
from operatorx.web import Queries, WebError
from operatorx.web.app import create_app
from operatorx.web.render import compare_file, slug
from operatorx.web.safe import shown_name
from operatorx.web.site import MARKER, build_site
from tests.store.conftest import done, pg_server_db, pg_url, planned  # noqa: F401 - fixtures used by name
from tests.web.conftest import page_data

ESC_ID = "run\x1b[31m-red\x1b[0m"
BIDI_ID = "run-\u202egpj.exe"
LONG_ID = "L" * 300


@pytest.fixture(params=["sqlite", "postgresql"])
def store_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return str(tmp_path / "ox.db") if request.param == "sqlite" else str(request.getfixturevalue("pg_url"))


def _run(store: Store, run_id: str, started_at: str, latency_us: float, testlist: str = "t") -> None:
    store.begin_run(run_id, started_at, testlist, "torch", "cpu", {}, planned(3))
    for i in range(3):
        store.put_row(run_id, done(i, latency_us=latency_us + i))
    store.finish_run(run_id, started_at.replace("T00", "T01"))


def _control_free(text_: str) -> bool:
    return not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", text_)


def test_one_odd_run_id_never_breaks_the_build_and_gets_a_safe_name(store_db, tmp_path):
    store = Store(store_db)
    _run(store, "plain-1", "2026-11-30T00:00:00", 10.0)
    ids = [ESC_ID, BIDI_ID] + ([LONG_ID] if "://" not in store_db else [])     # PostgreSQL ids are varchar(64)
    for n, rid in enumerate(ids):
        _run(store, rid, f"2026-12-0{n + 1}T00:00:00", 20.0 + n)
    store.close()
    site = build_site(Queries.open(store_db), tmp_path / "site", workers=1)
    assert site.skipped == () and site.runs == 1 + len(ids)
    names = sorted(p.name for p in site.directory.iterdir())
    for rid in ids:
        shown = shown_name(rid)
        assert "\\x1b" in shown or "\\u202e" in shown or len(shown) < len(rid)
        assert f"run-{slug(shown)}.html" in names
        assert re.fullmatch(r"[A-Za-z0-9_.~-]+", slug(shown))
    for page in site.directory.rglob("*"):
        assert _control_free(page.name)
        if page.suffix in (".html", ".js") and "static" not in page.parts:
            assert _control_free(page.read_text()), page.name
    index = page_data((site.directory / "index.html").read_text())
    assert sorted(r["id"] for r in index["runs"]) == sorted(["plain-1"] + [shown_name(r) for r in ids])
    # the server resolves the shown id back to the stored one, and its pages carry no ESC either
    client = TestClient(create_app(Queries.open(store_db)))
    for rid in ids:
        ref = quote(shown_name(rid), safe="")
        for url in (f"/run/{ref}", f"/roofline/{ref}", f"/case/{ref}/1", f"/shape?runs={ref}",
                    f"/compare?a=plain-1&b={ref}"):
            r = client.get(url)
            assert r.status_code == 200 and _control_free(r.text), url
        assert page_data(client.get(f"/run/{ref}").text)["rows"][1]["latency_us"] == 21.0 + ids.index(rid)


def test_a_run_that_cannot_be_rendered_is_skipped_with_one_line(store_db, tmp_path):
    store = Store(store_db)
    _run(store, "good", "2026-11-30T00:00:00", 10.0)
    _run(store, "bad", "2026-12-01T00:00:00", 20.0)
    with store.engine.begin() as conn:          # a row document no page can read (an odd ingest, a hand edit)
        conn.execute(text("UPDATE ox_rows SET record = :r WHERE run_id = 'bad' AND case_index = 1"), {"r": "[1, 2]"})
    store.close()
    for workers in (1, 2):
        out = tmp_path / f"site{workers}"
        site = build_site(Queries.open(store_db), out, workers=workers, compare="previous")
        assert site.runs == 1 and site.compares == 0
        assert len(site.skipped) == 2 and all("\n" not in n for n in site.skipped)
        assert any(n.startswith("run bad: skipped (") for n in site.skipped), site.skipped
        assert any(n.startswith("comparison bad against good: skipped (") for n in site.skipped), site.skipped
        names = {p.name for p in out.iterdir()}
        assert "run-good.html" in names and not any("bad" in n for n in names)
        assert not list((out / "data").glob("cases-bad-*"))
        assert [r["id"] for r in page_data((out / "index.html").read_text())["runs"]] == ["good"]
    done_ = subprocess.run([sys.executable, "-m", "operatorx", "report", "build", "--db", store_db, "-o",
                            str(tmp_path / "cli"), "--compare", "none"], capture_output=True, text=True, timeout=300)
    assert done_.returncode == 0, done_.stderr
    assert done_.stderr.startswith("note: run bad: skipped (") and len(done_.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done_.stderr and "1 runs" in done_.stdout


def test_compare_pages_get_one_file_per_pair(store_db, tmp_path):
    assert compare_file("p--q", "r") != compare_file("p", "q--r")
    assert compare_file("a-1", "b-2") == "compare-a-1--b-2.html"          # plain ids keep plain names
    assert compare_file("p-", "q") != compare_file("p", "-q")
    store = Store(store_db)
    latency = {"p--q": 10.0, "r": 20.0, "p": 30.0, "q--r": 40.0}
    for n, (rid, lat) in enumerate(latency.items()):
        _run(store, rid, f"2026-12-0{n + 1}T00:00:00", lat, testlist=f"t{n}")
    store.close()
    site = build_site(Queries.open(store_db), tmp_path / "site", compare=[("p--q", "r"), ("p", "q--r")], workers=1)
    assert site.compares == 2
    pages = sorted(site.directory.glob("compare-*.html"))
    assert len(pages) == 2
    for a, b in (("p--q", "r"), ("p", "q--r")):
        data = page_data((site.directory / compare_file(a, b)).read_text())
        assert (data["a"]["id"], data["b"]["id"]) == (a, b)
        assert [c["a_latency_us"] for c in data["cases"]] == [latency[a] + i for i in range(3)]
        assert [c["b_latency_us"] for c in data["cases"]] == [latency[b] + i for i in range(3)]
    index = (site.directory / "index.html").read_text()
    for a, b in (("p--q", "r"), ("p", "q--r")):
        assert f'href="{compare_file(a, b)}"' in index                       # the index links each page
        assert page_data(index)["links"]["compares"][f"{a}\n{b}"] == compare_file(a, b)     # and so can ox.js


def _site(tmp_path: Path) -> tuple[str, Path]:
    db = str(tmp_path / "ox.db")
    store = Store(db)
    _run(store, "r1", "2026-11-30T00:00:00", 10.0)
    store.close()
    out = tmp_path / "site"
    build_site(Queries.open(db), out, workers=1)
    return db, out


def test_a_rebuild_replaces_a_directory_only_of_its_own_files(tmp_path):
    db, out = _site(tmp_path)
    manifest = json.loads((out / MARKER).read_text())["files"]
    assert "index.html" in manifest and "static/plotly.min.js" in manifest and MARKER not in manifest
    assert manifest == {p.relative_to(out).as_posix(): p.stat().st_size for p in out.rglob("*")
                        if p.is_file() and p.name != MARKER}
    build_site(Queries.open(db), out, workers=1)                     # its own files only: replaced
    assert (out / "run-r1.html").is_file()

    (out / "data" / "notes.txt").write_text("mine")                  # a stray file, deep in the site
    with pytest.raises(WebError, match=r"data/notes.txt was not written by the last report build"):
        build_site(Queries.open(db), out, workers=1)
    assert (out / "data" / "notes.txt").read_text() == "mine" and (out / "index.html").is_file()
    (out / "data" / "notes.txt").unlink()

    (out / "index.html").write_text((out / "index.html").read_text() + "<!-- my notes -->")
    with pytest.raises(WebError, match="index.html has changed since report build wrote it"):
        build_site(Queries.open(db), out, workers=1)
    assert "my notes" in (out / "index.html").read_text()

    (out / "mine").mkdir()
    (out / "index.html").unlink()
    with pytest.raises(WebError, match="mine is a directory the last build did not write"):
        build_site(Queries.open(db), out, workers=1)


def test_a_directory_that_merely_holds_a_marker_is_never_emptied(tmp_path):
    db, _ = _site(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / MARKER).write_text("written by operatorx report build; the whole directory is replaced on rebuild\n")
    (mine / "thesis.tex").write_text("two years of work")
    (mine / "index.html").write_text("<p>my own page</p>")
    done_ = subprocess.run([sys.executable, "-m", "operatorx", "report", "build", "--db", db, "-o", str(mine)],
                           capture_output=True, text=True, timeout=300)
    assert done_.returncode == 2 and "Traceback" not in done_.stderr
    assert len(done_.stderr.strip().splitlines()) == 1 and "without the list of files" in done_.stderr
    assert (mine / "thesis.tex").read_text() == "two years of work"
    (mine / MARKER).write_text(json.dumps({"files": {"index.html": len("<p>my own page</p>")}}))
    done_ = subprocess.run([sys.executable, "-m", "operatorx", "report", "build", "--db", db, "-o", str(mine)],
                           capture_output=True, text=True, timeout=300)
    assert done_.returncode == 2 and "thesis.tex was not written by the last report build" in done_.stderr
    assert sorted(p.name for p in mine.iterdir()) == sorted([MARKER, "thesis.tex", "index.html"])
