"""`operatorx report build`: the dashboard as files that open from disk (file://), the artifact a CI
sweep uploads. The same query layer and templates as the server; links name files, and the Case
page reads the case from the run's data scripts (a browser lets file:// pages load scripts, not fetch).

Layout: index.html, shape.html, run-<run>.html, roofline-<run>.html, case-<run>.html?case=N,
compare-<a>--<b>.html (each run against the previous selected run of the same testlist),
data/cases-<run>-<chunk>.js, static/ (plotly.js, the pages' scripts and CSS).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from operatorx.web import render
from operatorx.web.app import STATIC_DIR
from operatorx.web.queries import Queries, WebError
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
        text = json.dumps(cases[i:i + size], separators=(",", ":"), allow_nan=False)
        text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
        _write(data_dir / file, f"oxCaseChunk({text});\n")
        chunks.append(f"data/{file}")
    return chunks, [int(c["index"]) for c in cases if isinstance(c.get("index"), int)]


def build_site(queries: Queries, out: Path, runs: Optional[list[str]] = None) -> SiteSummary:
    """Write the site for `runs` (ids, prefixes, `latest`; all runs when None) into `out`, replacing it.
    Written beside `out` first, then moved in, so a failed build leaves the old site whole."""
    chosen: list[RunSummary] = []
    for r in [queries.resolve(r) for r in runs] if runs else queries.runs():
        if all(c.id != r.id for c in chosen):
            chosen.append(r)
    pairs = _pairs(chosen)
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
        pages = 0
        _write(tmp / "index.html", render.render_runs(chosen, links))
        _write(tmp / "shape.html", render.render_shape([(r, queries.rows(r)) for r in chosen], links))
        pages += 2
        for r in chosen:
            name = render.slug(r.id)
            _write(tmp / f"run-{name}.html", render.render_run(queries.run_page(r.id), links))
            _write(tmp / f"roofline-{name}.html", render.render_roofline(queries.roofline(r.id), links))
            chunks, indexes = _case_chunks(queries, r, tmp / "data")
            _write(tmp / f"case-{name}.html", render.render_case(r, links, chunks=chunks, indexes=indexes))
            pages += 3
        for a, b in pairs:
            page = queries.compare(a, b)
            _write(tmp / f"compare-{render.slug(a)}--{render.slug(b)}.html",
                   render.render_compare(page, links, chosen))
            pages += 1
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
    return SiteSummary(directory=out, runs=len(chosen), pages=pages, compares=len(pairs))
