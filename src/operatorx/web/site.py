"""`operatorx report build`: the dashboard as files that open from disk (file://), the artifact a CI
sweep uploads. The same query layer and templates as the server; links name files, and the Case
page reads the case from the run's data scripts (a browser lets file:// pages load scripts, not fetch).

Layout: index.html, shape.html, run-<run>.html, roofline-<run>.html, case-<run>.html?case=N,
compare-<a>--<b>.html (by default the newest run of each testlist against the one before it),
data/cases-<run>-<chunk>.js, static/ (plotly.js, the pages' scripts and CSS).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from operatorx.web import render
from operatorx.web.app import STATIC_DIR
from operatorx.web.queries import Queries, WebError
from operatorx.web.safe import clean_json
from operatorx.web.views import RunSummary

__all__ = ["build_site", "SiteSummary", "MARKER"]

MARKER = ".operatorx-site"


@dataclass(frozen=True)
class SiteSummary:
    directory: Path
    runs: int
    pages: int
    compares: int


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def _pairs(runs: list[RunSummary]) -> list[tuple[str, str]]:
    """(previous, run) for each run and the previous selected run of its testlist, by start time."""
    last: dict[str, str] = {}
    out = []
    for r in sorted(runs, key=lambda r: r.started_at):
        if r.testlist in last:
            out.append((last[r.testlist], r.id))
        last[r.testlist] = r.id
    return out


def _case_chunks(queries: Queries, run: RunSummary, data_dir: Path) -> tuple[list[str], list[int]]:
    cases = queries.cases(run)
    name = render.slug(run.id)
    chunks = []
    size = render.CASES_PER_CHUNK
    for i in range(0, max(len(cases), 1), size):
        file = f"cases-{name}-{i // size}.js"
        # JSON is a JS expression; in a file of its own, no `</script>` can end anything.
        text = clean_json(cases[i:i + size])
        text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
        _write(data_dir / file, f"oxCaseChunk({text});\n")
        chunks.append(f"data/{file}")
    return chunks, [int(c["index"]) for c in cases if isinstance(c.get("index"), int)]


def _run_pages(queries: Queries, run: RunSummary, links: render.Links, tmp: Path) -> list[dict[str, Any]]:
    """The run's Run, Roofline and Case pages (and case data); returns its Shape page rows."""
    name = render.slug(run.id)
    page = queries.run_page(run.id)
    _write(tmp / f"run-{name}.html", render.render_run(page, links))
    _write(tmp / f"roofline-{name}.html", render.render_roofline(queries.roofline(run.id), links))
    chunks, indexes = _case_chunks(queries, run, tmp / "data")
    _write(tmp / f"case-{name}.html", render.render_case(run, links, chunks=chunks, indexes=indexes))
    return render.shape_rows(page.rows)


def _compare_page(queries: Queries, a: str, b: str, links: render.Links, runs: list[RunSummary], tmp: Path) -> None:
    _write(tmp / f"compare-{render.slug(a)}--{render.slug(b)}.html",
           render.render_compare(queries.compare(a, b), links, runs))


def _in_worker(job: str, db: str, *args: Any) -> Any:
    queries = Queries.open(db)
    return _run_pages(queries, *args) if job == "run" else _compare_page(queries, *args)


def _all_pages(queries: Queries, runs: list[RunSummary], pairs: list[tuple[str, str]], links: render.Links,
               tmp: Path, workers: Optional[int]) -> dict[str, list[dict[str, Any]]]:
    """Each run's pages and each comparison, in worker processes when there are several jobs and CPUs
    (reading and writing rows is CPU-bound JSON work; comparisons, the longest, go first). Returns the
    runs' Shape rows by run id."""
    n = min(workers or os.cpu_count() or 1, len(runs) + len(pairs))
    if n <= 1 or queries.db is None:
        for a, b in pairs:
            _compare_page(queries, a, b, links, runs, tmp)
        return {r.id: _run_pages(queries, r, links, tmp) for r in runs}
    with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn")) as pool:
        compares = [pool.submit(_in_worker, "compare", queries.db, a, b, links, runs, tmp) for a, b in pairs]
        pages = {r.id: pool.submit(_in_worker, "run", queries.db, r, links, tmp) for r in runs}
        for f in compares:
            f.result()
        return {rid: f.result() for rid, f in pages.items()}


def build_site(queries: Queries, out: Path, runs: Optional[list[str]] = None,
               compare: Union[str, list[tuple[str, str]]] = "latest", workers: Optional[int] = None) -> SiteSummary:
    """Write the site for `runs` (ids, prefixes, `latest`; all runs when None) into `out`, replacing it.

    `compare`: `latest` (the newest selected run of each testlist against the one before it),
    `previous` (every run against the one before it), `none`, or (A, B) pairs. `workers`: processes
    that write the runs' pages (default: one per CPU, at most one per run; 1 writes them here).
    Written beside `out` first, then moved in, so a failed build leaves the old site whole."""
    chosen: list[RunSummary] = []
    for r in [queries.resolve(r) for r in runs] if runs else queries.runs():
        if all(c.id != r.id for c in chosen):
            chosen.append(r)
    if compare == "previous":
        pairs = _pairs(chosen)
    elif compare == "latest":
        newest: dict[str, tuple[str, str]] = {}
        for a, b in _pairs(chosen):             # in start order: the last pair of a testlist is its newest
            newest[next(r.testlist for r in chosen if r.id == b)] = (a, b)
        pairs = list(newest.values())
    elif compare == "none":
        pairs = []
    elif isinstance(compare, list):
        pairs = [(queries.resolve(a).id, queries.resolve(b).id) for a, b in compare]
        for a, b in pairs:
            for rid in (a, b):
                if all(c.id != rid for c in chosen):
                    chosen.append(queries.resolve(rid))
    else:
        raise WebError(f"compare {compare!r}: give latest, previous, none, or A:B run pairs")
    links = render.static_links(frozenset(pairs))
    out = out.expanduser().resolve()
    if out.exists() and not (out.is_dir() and (not any(out.iterdir()) or (out / MARKER).is_file())):
        raise WebError(f"{out} exists and is not a site report build wrote: give a new or empty directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)
    try:
        _write(tmp / MARKER, "written by operatorx report build; the whole directory is replaced on rebuild\n")
        shutil.copytree(STATIC_DIR, tmp / "static")
        (tmp / "data").mkdir()
        shape = _all_pages(queries, chosen, pairs, links, tmp, workers)
        _write(tmp / "index.html", render.render_runs(chosen, links))
        _write(tmp / "shape.html", render.render_shape([(r, shape[r.id]) for r in chosen], links))
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.replace(out, old / "site")
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return SiteSummary(directory=out, runs=len(chosen), pages=2 + 3 * len(chosen) + len(pairs), compares=len(pairs))
