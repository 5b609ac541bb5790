"""The pages as HTML: one Jinja environment (autoescape on) and one function per page, called by the
server and by the static build alike. They differ only in `Links` (where a page lives) and in how
the Case page gets its data (inline, or from the run's data scripts on disk)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, select_autoescape

from operatorx.report.ab import DIFFERENCE_SAYS
from operatorx.shown import SHOWN
from operatorx.web.gpus import FleetPage
from operatorx.web.model import FACT_FIELDS, MAX_MODEL_RUNS, ModelPage, catalog_models
from operatorx.web.pairs import Pairing, comparable_pairs
from operatorx.web.queries import ComparePage, GroupPage, RooflinePage, RunPage
from operatorx.web.safe import script_json
from operatorx.web.views import RowView, RunSummary

__all__ = ["Links", "server_links", "static_links", "slug", "compare_file", "render_runs", "render_run", "render_group",
           "render_shape", "shape_rows", "render_roofline", "render_case", "render_compare", "render_error",
           "render_gpus", "render_gpus_index", "render_model", "CASES_PER_CHUNK"]

CASES_PER_CHUNK = 250
_env = Environment(loader=PackageLoader("operatorx.web", "templates"), autoescape=select_autoescape(default=True),
                   trim_blocks=True, lstrip_blocks=True)


_SLUG_CHARS = re.compile(r"[A-Za-z0-9_.-]{1,80}")
_PLAIN_SLUG = re.compile(r"[A-Za-z0-9_.]+(?:-[A-Za-z0-9_.]+)*")     # no `--`, no dash at either end


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def slug(run_id: str) -> str:
    """A file-name-safe name for a run id, one per id (ids are free text in ingested documents).

    An id of up to 80 letters, digits, `.`, `_` and `-` is its own slug; any other gets its safe
    characters and `~` with 12 hex digits of its SHA-256. A `~` is never in the first kind, so a
    crafted id cannot take another run's file name."""
    if _SLUG_CHARS.fullmatch(run_id):
        return run_id
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', run_id)[:60]}~{_digest(run_id)}"


def compare_file(a: str, b: str) -> str:
    """The static site's file for the comparison of run `a` against run `b`, one per ordered pair.

    `compare-A--B.html` when neither slug holds `--` or starts or ends with `-` (then the one `--`
    tells where A ends, so `p--q`/`r` and `p`/`q--r` cannot meet); otherwise `~` and 12 hex digits of
    the pair's SHA-256 follow the names (a `~` the plain form never has)."""
    sa, sb = slug(a), slug(b)
    if _PLAIN_SLUG.fullmatch(sa) and _PLAIN_SLUG.fullmatch(sb):
        return f"compare-{sa}--{sb}.html"
    return f"compare-{sa[:40]}--{sb[:40]}~{_digest(json.dumps([a, b]))}.html"


@dataclass(frozen=True)
class Links:
    """URL patterns; `{run}`, `{a}`, `{b}`, `{index}`, `{runs}` are filled by `link` (and by ox.js, which
    gets the same patterns). Static sites name runs by slug."""
    static: str
    patterns: dict[str, str]
    static_site: bool
    compare_pairs: frozenset[tuple[str, str]] = field(default_factory=frozenset)
    groups: frozenset[str] = field(default_factory=frozenset)
    """Static sites: the run groups that have a group page."""

    def ref(self, run_id: str) -> str:
        return slug(run_id) if self.static_site else quote(run_id, safe="")

    def link(self, kind: str, **params: Any) -> str:
        if kind == "compare" and self.static_site:
            return compare_file(str(params["a"]), str(params["b"]))
        out = self.patterns[kind]
        for name, value in params.items():
            if name in ("run", "a", "b", "group", "testlist"):
                value = self.ref(str(value))
            elif name == "runs":
                value = ",".join(quote(str(v), safe="") for v in value)
            out = out.replace("{" + name + "}", str(value))
        return out

    def has_compare(self, a: str, b: str) -> bool:
        return not self.static_site or (a, b) in self.compare_pairs

    def group_link(self, name: Optional[str]) -> Optional[str]:
        """The page of run group `name`, where there is one."""
        if not name or (self.static_site and name not in self.groups):
            return None
        return self.link("group", group=name)

    def to_json(self, runs: list[str]) -> dict[str, Any]:
        return {"patterns": self.patterns, "static": self.static_site,
                "slugs": {r: slug(r) for r in runs} if self.static_site else None,
                "pairs": sorted(f"{a}\n{b}" for a, b in self.compare_pairs),
                "compares": {f"{a}\n{b}": compare_file(a, b) for a, b in sorted(self.compare_pairs)}}


def server_links() -> Links:
    return Links(static="/static/", static_site=False, patterns={
        "runs": "/", "run": "/run/{run}", "case": "/case/{run}/{index}", "shape": "/shape?runs={runs}",
        "roofline": "/roofline/{run}", "compare": "/compare?a={a}&b={b}", "compare_pick": "/compare",
        "group": "/group/{group}", "gpus": "/gpus/{testlist}", "gpus_index": "/gpus", "model": "/model?run={run}",
        "model_pick": "/model"})


def static_links(pairs: frozenset[tuple[str, str]], groups: frozenset[str] = frozenset()) -> Links:
    return Links(static="static/", static_site=True, compare_pairs=pairs, groups=groups, patterns={
        "runs": "index.html", "run": "run-{run}.html", "case": "case-{run}.html?case={index}",
        "shape": "shape.html", "roofline": "roofline-{run}.html", "compare": "compare-{a}--{b}.html",
        "compare_pick": "", "group": "group-{group}.html", "gpus": "gpus-{testlist}.html",
        "gpus_index": "gpus.html"})


def _page(template: str, links: Links, title: str, data: dict[str, Any], run_ids: list[str], **extra: Any) -> str:
    page = {**data, "links": links.to_json(run_ids)}
    return _env.get_template(template).render(title=title, links=links, data=script_json(page), **extra)


def _rows_json(rows: list[RowView]) -> list[dict[str, Any]]:
    return [r.to_json() for r in rows]


def render_runs(runs: list[RunSummary], links: Links, pairings: Optional[list[Pairing]] = None) -> str:
    """`pairings`: the comparisons to offer, each on its newer run's line (`previous`, with `compare_why`);
    the default ones (web/pairs.py) when None."""
    pairings = comparable_pairs(runs) if pairings is None else pairings
    against = {p.b: p for p in pairings}
    data = {"page": "runs", "runs": [{**r.to_json(), "previous": against[r.id].a if r.id in against else None,
                                      "compare_why": against[r.id].why if r.id in against else None,
                                      "group_href": links.group_link(r.run_group)} for r in runs]}
    return _page("runs.html", links, "Runs", data, [r.id for r in runs], runs=runs, pairings=pairings)


def render_group(page: GroupPage, links: Links) -> str:
    """A run group as one sweep: its shards, and the rows of all of them, each with its shard."""
    shard_of = {r.id: r.shard for r in page.shards}
    rows = [{**v.to_json(), "run": rid, "shard": shard_of.get(rid)} for rid, v in page.rows]
    data = {"page": "group", "run": page.run.to_json(), "shards": [r.to_json() for r in page.shards], "rows": rows,
            "metrics": [m.to_json() for m in SHOWN
                        if not m.optional or any(v.shown.get(m.key) is not None for _, v in page.rows)]}
    return _page("group.html", links, f"Run group {page.run.run_group}", data, [r.id for r in page.shards],
                 group=page)


def render_run(page: RunPage, links: Links) -> str:
    data = {"page": "run", "run": page.run.to_json(), "rows": _rows_json(page.rows), "ab_says": DIFFERENCE_SAYS,
            "metrics": [m.to_json() for m in SHOWN
                        if not m.optional or any(r.shown.get(m.key) is not None for r in page.rows)]}
    # the Model page is the server's (it writes a scenario from the facts a URL gives): linked where the
    # run's rows cite a catalog checkpoint, the cases `testlist serving` writes
    model_href = None if links.static_site or not catalog_models({m for r in page.rows for m in r.models}) \
        else links.link("model", run=page.run.id)
    return _page("run.html", links, f"Run {page.run.id}", data, [page.run.id], run=page.run, info=page.info,
                 ab_says=DIFFERENCE_SAYS, model_href=model_href,
                 reasons=page.reasons, missing=page.missing[:200], missing_total=len(page.missing))


def shape_rows(rows: list[RowView]) -> list[dict[str, Any]]:
    """What the Shape page plots of a run: its ok rows that have a size and a latency."""
    return [{"index": v.index, "label": v.label, "family": v.family, "m": v.m, "models": v.models, "roles": v.roles,
             "latency_us": v.latency_us, "tflops": v.tflops, "side": v.side, "backend": v.backend, "scheme": v.scheme}
            for v in rows if v.status == "ok" and v.m is not None and v.latency_us]


def render_shape(runs: list[tuple[RunSummary, list[dict[str, Any]]]], links: Links) -> str:
    """`runs`: each run with its `shape_rows`."""
    names = [r.series for r, _ in runs]
    series = [{"run": r.to_json(), "name": r.series if names.count(r.series) == 1 else f"{r.series} ({r.id})",
               "rows": rows} for r, rows in runs]
    return _page("shape.html", links, "Shape", {"page": "shape", "series": series}, [r.id for r, _ in runs],
                 runs=[r for r, _ in runs], plots=True)


def render_roofline(page: RooflinePage, links: Links) -> str:
    data = {"page": "roofline", "run": page.run.to_json(), "points": _rows_json(page.points),
            "compute_tflops": page.compute_tflops, "memory_gbps": page.memory_gbps, "source": page.peak_source,
            "datasheet_tflops": page.datasheet_tflops, "datasheet_memory_gbps": page.datasheet_memory_gbps,
            "compute_measured": page.compute_measured, "memory_measured": page.memory_measured}
    return _page("roofline.html", links, f"Roofline {page.run.id}", data, [page.run.id], run=page.run,
                 page_data=page, plots=True)


def render_case(run: RunSummary, links: Links, detail: Optional[dict[str, Any]] = None,
                chunks: Optional[list[str]] = None, indexes: Optional[list[int]] = None) -> str:
    """Inline (`detail`, the server) or by reference (`chunks`: the run's data scripts, the static site;
    the page picks the case named in its `?case=`)."""
    data = {"page": "case", "run": run.to_json(), "case": detail, "chunk_size": CASES_PER_CHUNK,
            "chunks": chunks, "indexes": indexes, "ab_says": DIFFERENCE_SAYS}
    title = f"Case {detail['index']} of {run.id}" if detail else f"Cases of {run.id}"
    return _page("case.html", links, title, data, [run.id], run=run, plots=True)


def render_compare(page: Optional[ComparePage], links: Links, runs: list[RunSummary]) -> str:
    if page is None:
        data: dict[str, Any] = {"page": "compare", "cases": None}
        return _page("compare.html", links, "Compare", data, [r.id for r in runs], cmp=None, runs=runs)
    data = {"page": "compare", "a": page.a.to_json(), "b": page.b.to_json(),
            "cases": [c.to_json() for c in page.cases], "flags": page.flags}
    return _page("compare.html", links, f"Compare {page.a.id} / {page.b.id}", data, [page.a.id, page.b.id],
                 cmp=page, runs=runs, plots=True)


def render_gpus_index(testlists: list[tuple[str, list[RunSummary]]], links: Links) -> str:
    """The testlists that have a GPUs page, each with the runs it compares."""
    data = {"page": "gpus_index", "testlists": [{"testlist": t, "href": links.link("gpus", testlist=t),
                                                 "runs": [r.id for r in runs]} for t, runs in testlists]}
    ids = sorted({r.id for _, runs in testlists for r in runs})
    return _page("gpus_index.html", links, "GPUs", data, ids, testlists=testlists)


def render_gpus(page: FleetPage, links: Links) -> str:
    """One testlist's runs on different GPUs against a baseline (web/gpus.py computes every number)."""
    data = {"page": "gpus", **page.to_json()}
    return _page("gpus.html", links, f"GPUs: {page.testlist}", data, [r.run.id for r in page.runs], fleet=page,
                 plots=True)


def render_model(page: Optional[ModelPage], links: Links, runs: list[RunSummary]) -> str:
    """A serving scenario's step time per run, layer by layer (web/model.py computes every number);
    `page` None: the form that picks a run."""
    if page is None:
        return _page("model.html", links, "Model", {"page": "model", "runs": [], "steps": [], "classes": []},
                     [], model=None, runs=runs, fields=FACT_FIELDS, max_runs=MAX_MODEL_RUNS)
    data = {"page": "model", **page.to_json()}
    ids = [r.run.id for r in page.runs]
    title = "Model: " + " / ".join(ids)
    return _page("model.html", links, title, data, ids, model=page, runs=runs, fields=FACT_FIELDS,
                 max_runs=MAX_MODEL_RUNS, plots=True)


def render_error(message: str, links: Links, title: str = "Not found") -> str:
    return _page("error.html", links, title, {"page": "error"}, [], message=message)
