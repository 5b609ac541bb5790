"""`operatorx report build`: the dashboard as files that open from disk (file://), the artifact a CI
sweep uploads. The same query layer and templates as the server; links name files, and the Case
page reads the case from the run's data scripts (a browser lets file:// pages load scripts, not fetch).

Layout: index.html, shape.html, run-<run>.html, roofline-<run>.html, case-<run>.html?case=N,
gpus.html and gpus-<testlist>.html (a testlist's runs on different GPUs, web/gpus.py),
compare-<a>--<b>.html (by default each run against the newest earlier run comparable with it,
web/pairs.py; one file per ordered pair, `render.compare_file`), group-<name>.html (a run group whose
runs are all in the site, as one sweep), data/cases-<run>-<chunk>.js, static/ (plotly.js, the pages'
scripts and CSS), and `.operatorx-site`: the list of every file this build wrote, with its size. A
rebuild replaces the directory only while it holds exactly those files; anything else is named and
refused, so a directory that merely holds a marker is never emptied.
"""

from __future__ import annotations

import glob
import json
import multiprocessing
import os
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Optional, Union

from operatorx.web import render
from operatorx.web.app import STATIC_DIR
from operatorx.web.pairs import Pairing, comparable_pairs, newest_pairs, previous_pairs
from operatorx.web.queries import Queries, WebError
from operatorx.web.safe import clean_json, shown_name
from operatorx.web.views import RunSummary

__all__ = ["build_site", "SiteSummary", "MARKER"]

MARKER = ".operatorx-site"


@dataclass(frozen=True)
class SiteSummary:
    directory: Path
    runs: int
    pages: int
    compares: int
    skipped: tuple[str, ...] = ()
    """One line per run or comparison left out (its data could not be read or rendered)."""
    pairings: tuple[Pairing, ...] = ()
    """The comparisons written, each with why it was chosen."""
    groups: int = 0
    """Run group pages written."""
    gpu_pages: int = 0
    """GPUs pages written, one per testlist with runs of two GPUs or backends (gpus.html lists them)."""


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def _pairings(queries: Queries, chosen: list[RunSummary],
              compare: Union[str, list[tuple[str, str]]]) -> list[Pairing]:
    """The comparisons `compare` asks for (web/pairs.py gives the rules); runs named in A:B pairs join
    `chosen`."""
    rules = {"comparable": comparable_pairs, "latest": newest_pairs, "previous": previous_pairs}
    if isinstance(compare, str) and compare in rules:
        return rules[compare](chosen)
    if compare == "none":
        return []
    if not isinstance(compare, list):
        raise WebError(f"compare {compare!r}: give comparable, latest, previous, none, or A:B run pairs")
    out = []
    for a, b in compare:
        ra, rb = queries.resolve(a), queries.resolve(b)
        for r in (ra, rb):
            if all(c.id != r.id for c in chosen):
                chosen.append(r)
        out.append(Pairing(ra.id, rb.id, f"asked for (--compare {ra.id}:{rb.id})"))
    return out


def _group_pages(queries: Queries, shown: list[RunSummary], links: render.Links, tmp: Path
                 ) -> tuple[list[str], list[str]]:
    """A page for each run group all of whose runs are in the site (its rows link to theirs); returns the
    groups written and a note for each one that could not be."""
    every = queries.runs()
    names = sorted({r.run_group for r in shown if r.run_group})
    ids = {r.id for r in shown}
    written, notes = [], []
    for name in names:
        if any(r.id not in ids for r in every if r.run_group == name):
            continue
        try:
            _write(tmp / f"group-{render.slug(name)}.html", render.render_group(queries.group_page(name), links))
            written.append(name)
        except OSError:
            raise
        except Exception as err:  # noqa: BLE001 - one group's data, told in one line
            notes.append(_note(f"run group {name}", err))
    return written, notes


def _gpu_pages(queries: Queries, shown: list[RunSummary], links: render.Links, tmp: Path) -> tuple[int, list[str]]:
    """gpus.html, and the GPUs page of each testlist with runs of two GPUs or backends among the site's
    runs (web/gpus.py); returns the testlist pages written and a note for each one that could not be."""
    written, notes, listed = 0, [], []
    for testlist, runs in queries.gpu_testlists(shown):
        try:
            _write(tmp / f"gpus-{render.slug(testlist)}.html",
                   render.render_gpus(queries.gpus_page(testlist, among=shown), links))
            written += 1
            listed.append((testlist, runs))
        except OSError:
            raise
        except Exception as err:  # noqa: BLE001 - one testlist's data, told in one line
            notes.append(_note(f"GPUs page of testlist {testlist}", err))
    _write(tmp / "gpus.html", render.render_gpus_index(listed, links))
    return written, notes


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
    _write(tmp / render.compare_file(a, b), render.render_compare(queries.compare(a, b), links, runs))


def _note(what: str, err: Exception) -> str:
    """One line for a run or comparison left out of the site: what, and why."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return shown_name(f"{what}: skipped ({type(err).__name__}: {first[:200]})")[:300]


def _remove_run_files(run: RunSummary, tmp: Path) -> None:
    """What a failed run's pages had written already: a skipped run leaves no half of itself."""
    name = render.slug(run.id)
    for f in (tmp / f"run-{name}.html", tmp / f"roofline-{name}.html", tmp / f"case-{name}.html"):
        f.unlink(missing_ok=True)
    for f in (tmp / "data").glob(f"cases-{glob.escape(name)}-*.js"):
        f.unlink(missing_ok=True)


def _job(queries: Queries, job: str, args: tuple[Any, ...]) -> tuple[Optional[Any], Optional[str]]:
    """(result, None), or (None, note) when this one run or comparison cannot be built: one bad run
    (an odd ingested document) never fails the whole site. A failure to write (OSError: a full disk)
    is not the run's fault and still stops the build."""
    try:
        if job == "run":
            return _run_pages(queries, *args), None
        _compare_page(queries, *args)
        return True, None
    except OSError:
        raise
    except Exception as err:  # noqa: BLE001 - one run's data, told in one line
        if job == "run":
            _remove_run_files(args[0], args[-1])
            return None, _note(f"run {args[0].id}", err)
        return None, _note(f"comparison {args[1]} against {args[0]}", err)


def _in_worker(job: str, db: str, *args: Any) -> tuple[Optional[Any], Optional[str]]:
    return _job(Queries.open(db), job, args)


def _all_pages(queries: Queries, runs: list[RunSummary], pairs: list[tuple[str, str]], links: render.Links,
               tmp: Path, workers: Optional[int]
               ) -> tuple[dict[str, list[dict[str, Any]]], list[tuple[str, str]], list[str]]:
    """Each run's pages and each comparison, in worker processes when there are several jobs and CPUs
    (reading and writing rows is CPU-bound JSON work; comparisons, the longest, go first). Returns the
    written runs' Shape rows by run id, the comparisons written, and a note for each one skipped."""
    n = min(workers or os.cpu_count() or 1, len(runs) + len(pairs))
    if n <= 1 or queries.db is None:
        compared = [_job(queries, "compare", (a, b, links, runs, tmp)) for a, b in pairs]
        done = {r.id: _job(queries, "run", (r, links, tmp)) for r in runs}
    else:
        with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_in_worker, "compare", queries.db, a, b, links, runs, tmp) for a, b in pairs]
            pages = {r.id: pool.submit(_in_worker, "run", queries.db, r, links, tmp) for r in runs}
            compared = [f.result() for f in futures]
            done = {rid: f.result() for rid, f in pages.items()}
    notes = [note for _, note in compared if note] + [note for _, note in done.values() if note]
    written = [pair for pair, (_, note) in zip(pairs, compared, strict=True) if note is None]
    shape: dict[str, list[dict[str, Any]]] = {rid: rows or [] for rid, (rows, note) in done.items() if note is None}
    return shape, written, notes


def _manifest(site: Path) -> dict[str, int]:
    """Every file under `site` (the marker aside) by its path there, with its size in bytes."""
    return {p.relative_to(site).as_posix(): p.stat().st_size for p in sorted(site.rglob("*"))
            if p.is_file() and not p.is_symlink() and p.name != MARKER}


def _stray(out: Path) -> Optional[str]:
    """Why `out` may not be replaced, or None: it is missing, empty, or holds exactly the files its
    last build wrote (the list in its marker), each at the size it was written. Anything else (a file
    the build did not write, one changed since, a link, a directory of someone's) is named."""
    if not out.exists():
        return None
    if not out.is_dir():
        return f"{out} exists and is not a directory: give a new or empty directory"
    if not any(out.iterdir()):
        return None
    marker = out / MARKER
    if not marker.is_file():
        return f"{out} exists and is not a site report build wrote: give a new or empty directory"
    try:
        files = json.loads(marker.read_text(encoding="utf-8")).get("files")
        if not isinstance(files, dict):
            raise ValueError("no files")
    except (OSError, ValueError, AttributeError, UnicodeDecodeError):
        return (f"{out} has a {MARKER} marker without the list of files its build wrote (an older OperatorX, or "
                "edited): remove the directory yourself, or give a new one")
    dirs = {parent.as_posix() for f in files for parent in PurePosixPath(f).parents}
    for p in sorted(out.rglob("*")):
        rel = p.relative_to(out).as_posix()
        if p == marker:
            continue
        if p.is_symlink() or not (p.is_file() or p.is_dir()):
            why = "is a link or a special file"
        elif p.is_dir():
            if rel in dirs:
                continue
            why = "is a directory the last build did not write"
        elif rel not in files:
            why = "was not written by the last report build"
        elif p.stat().st_size != files[rel]:
            why = "has changed since report build wrote it"
        else:
            continue
        return f"{out}: {shown_name(rel)} {why}: move it away, or give a new or empty directory"
    return None


def build_site(queries: Queries, out: Path, runs: Optional[list[str]] = None,
               compare: Union[str, list[tuple[str, str]]] = "comparable", workers: Optional[int] = None
               ) -> SiteSummary:
    """Write the site for `runs` (ids, prefixes, `latest`; all runs when None) into `out`, replacing it.

    `compare`: `comparable` (each selected run against the newest earlier selected run comparable with
    it: same testlist, backend and shard, another GPU or versions; web/pairs.py), `latest` (of those,
    the newest of each testlist, backend and shard), `previous` (each run against the run before it
    of the same testlist, backend and shard, whatever differs), `none`, or (A, B) pairs. `workers`: processes
    that write the runs' pages (default: one per CPU, at most one per run; 1 writes them here).
    Written beside `out` first, then moved in, so a failed build leaves the old site whole."""
    chosen: list[RunSummary] = []
    for r in [queries.resolve(r) for r in runs] if runs else queries.runs():
        if all(c.id != r.id for c in chosen):
            chosen.append(r)
    pairings = _pairings(queries, chosen, compare)
    pairs = [(p.a, p.b) for p in pairings]
    links = render.static_links(frozenset(pairs))
    out = out.expanduser().resolve()
    refused = _stray(out)
    if refused:
        raise WebError(refused)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)
    try:
        shutil.copytree(STATIC_DIR, tmp / "static")
        (tmp / "data").mkdir()
        shape, written, notes = _all_pages(queries, chosen, pairs, links, tmp, workers)
        shown = [r for r in chosen if r.id in shape]
        groups, group_notes = _group_pages(queries, shown, links, tmp)
        notes += group_notes
        links = render.static_links(frozenset(written), frozenset(groups))
        kept = [p for p in pairings if (p.a, p.b) in set(written)]
        _write(tmp / "index.html", render.render_runs(shown, links, kept))
        _write(tmp / "shape.html", render.render_shape([(r, shape[r.id]) for r in shown], links))
        gpu_pages, gpu_notes = _gpu_pages(queries, shown, links, tmp)
        notes += gpu_notes
        # the marker goes last: it lists every file of this build, what the next build may replace
        _write(tmp / MARKER, json.dumps({"written_by": "operatorx report build", "note": "the next build replaces "
                                         "this directory only while it holds just these files",
                                         "files": _manifest(tmp)}, indent=0) + "\n")
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
    return SiteSummary(directory=out, runs=len(shown),
                       pages=3 + 3 * len(shown) + len(written) + len(groups) + gpu_pages,
                       compares=len(written), skipped=tuple(notes), pairings=tuple(kept), groups=len(groups),
                       gpu_pages=gpu_pages)
