"""The dashboard's one query layer: opens the results database read-only and returns typed data
(web/views.py) for each page. The server (web/app.py) and the static build (web/site.py) both call
it, then render the same templates.

It reads only through the Store's read API (`list_runs`, `resolve_run`, `document`), on a store opened
read-only (`open_store`).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from operatorx.platform.peaks import peaks_for
from operatorx.report.compare import compare_documents
from operatorx.store import RunNotFound, Store, StoreError
from operatorx.store.group import GROUP_PREFIX, merge_rows
from operatorx.web.gpus import FleetPage, fleet_page, fleet_runs
from operatorx.web.model import ModelPage, ModelRun, ScenarioAsk, catalog_models, model_run, page_steps, scenario_for
from operatorx.web.safe import clean, clean_text, shown_name
from operatorx.web.timeline import kernel_timeline
from operatorx.web.views import (
    STATUSES,
    CompareCase,
    ReasonGroup,
    RowView,
    RunSummary,
    case_key,
    reason_groups,
    row_notes_of,
    row_view,
    run_summary,
)

__all__ = ["Queries", "WebError", "open_store", "RunPage", "GroupPage", "RooflinePage", "ComparePage", "fleet_key"]


class WebError(Exception):
    """One line that names the problem and the fix (bad --db, unknown run)."""


def open_store(db: str) -> Store:
    """The store at `db` (a path or URL), read-only (`Store(read_only=True)`: SQLite `mode=ro`, and
    `immutable=1` on read-only media; PostgreSQL READ ONLY sessions); never creates a database."""
    try:
        store = Store(db, create=False, read_only=True)
    except (StoreError, RunNotFound) as err:
        raise WebError(str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__) from None
    except Exception as err:  # noqa: BLE001 - a driver's error, told in one line
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        from operatorx.store.redact import hide_password

        raise WebError(hide_password(f"cannot open --db {db}: {first}")) from None
    return store


@dataclass(frozen=True)
class RunPage:
    run: RunSummary
    info: dict[str, Any]
    rows: list[RowView]
    reasons: list[ReasonGroup]
    missing: list[RowView]


@dataclass(frozen=True)
class GroupPage:
    """A run group (`--run-group`, e.g. the shards of one sweep) as one sweep: `run` sums it up (id
    `group:NAME`, counts of the merged rows), `shards` are its runs oldest first, and each row comes with
    the id of the run it was taken from (store/group.py `merge_rows`)."""
    name: str
    run: RunSummary
    shards: list[RunSummary]
    rows: list[tuple[str, RowView]]


def _number(value: Any) -> Optional[float]:
    """A positive finite number from a stored document, else None (a peak of 0 draws no ceiling)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    return None


@dataclass(frozen=True)
class RooflinePage:
    run: RunSummary
    points: list[RowView]
    compute_tflops: dict[str, float]     # by compute class: measured where the rows have it, else datasheet
    memory_gbps: Optional[float]
    peak_source: Optional[str]
    datasheet_tflops: dict[str, float] = field(default_factory=dict)
    """The datasheet ceilings, only where measured ones differ from them (drawn dotted beside)."""
    datasheet_memory_gbps: Optional[float] = None
    compute_measured: dict[str, bool] = field(default_factory=dict)
    """By compute class: whether its compute ceiling is this GPU's measured one (the rows'
    `peak.measured_tflops`); a class the calibration does not measure (fp16, fp32) has the datasheet's
    even where the memory ceiling is measured."""
    memory_measured: bool = False
    """Whether the memory ceiling is this GPU's measured one (the rows' `peak.measured_memory_gbps`)."""


@dataclass(frozen=True)
class ComparePage:
    a: RunSummary
    b: RunSummary
    cases: list[CompareCase]
    verdicts: dict[str, int]
    flags: list[str] = field(default_factory=list)
    """What differs between the two runs as a whole, and placement not controlled in either (compare.py)."""


class Queries:
    """Typed reads over one read-only store. Documents of finished runs are cached (they do not
    change); a running run is read again on each call."""

    def __init__(self, store: Store, cache_documents: int = 4):
        self.store = store
        self._lock = threading.Lock()
        self._docs: OrderedDict[tuple[str, Any], dict[str, Any]] = OrderedDict()
        self._views: OrderedDict[tuple[str, Any], list[RowView]] = OrderedDict()
        self._max_docs = cache_documents
        self.db: Optional[str] = None       # the --db it was opened from (the static build's workers reopen it)

    @classmethod
    def open(cls, db: str) -> Queries:
        queries = cls(open_store(db))
        queries.db = db
        return queries

    # runs ---------------------------------------------------------------------------------------
    def runs(self) -> list[RunSummary]:
        return [run_summary(r) for r in self.store.list_runs()]

    def resolve(self, run: str) -> RunSummary:
        """The run a page names: its id as shown (`shown_name`) or as stored, exactly; else a unique
        prefix of a stored id, or `latest`. Exact names come first, so a crafted id cannot take over
        another run's prefix."""
        runs = self.runs()
        for r in runs:
            if run in (r.id, r.key):
                return r
        try:
            rid = self.store.resolve_run(run)
        except RunNotFound as err:
            raise WebError(clean_text(str(err).splitlines()[0])) from err
        for r in runs:
            if r.key == rid:
                return r
        raise WebError(f"no run {shown_name(run)!r}")

    def _stamp(self, run: RunSummary) -> Any:
        counts = tuple(sorted(run.counts.items())) if run.counts else None
        return None if run.state == "running" else (run.state, run.finished_at, run.rows, counts)

    def document(self, run: RunSummary) -> dict[str, Any]:
        stamp = self._stamp(run)
        with self._lock:
            if stamp is not None and (run.key, stamp) in self._docs:
                self._docs.move_to_end((run.key, stamp))
                return self._docs[(run.key, stamp)]
        doc = self.store.document(run.key)
        if stamp is not None:
            with self._lock:
                self._docs[(run.key, stamp)] = doc
                while len(self._docs) > self._max_docs:
                    self._docs.popitem(last=False)
        return doc

    def rows(self, run: RunSummary) -> list[RowView]:
        stamp = self._stamp(run)
        with self._lock:
            if stamp is not None and (run.key, stamp) in self._views:
                return self._views[(run.key, stamp)]
        views = [row_view(r) for r in self.document(run)["rows"]]
        if stamp is not None:
            with self._lock:
                self._views[(run.key, stamp)] = views
                while len(self._views) > 64:
                    self._views.popitem(last=False)
        return views

    # pages --------------------------------------------------------------------------------------
    def run_page(self, run: str) -> RunPage:
        summary = self.resolve(run)
        doc = self.document(summary)
        rows = self.rows(summary)
        info = {k: v for k, v in doc.get("run", {}).items() if k not in ("id",)}
        return RunPage(run=summary, info=clean(info), rows=rows, reasons=reason_groups(rows),
                       missing=[r for r in rows if r.status == "missing"])

    def group_page(self, name: str) -> GroupPage:
        """The runs whose run group is `name` (as pages show it), merged into one sweep."""
        shards = sorted((r for r in self.runs() if r.run_group == name), key=lambda r: (r.started_at, r.id))
        if not shards:
            raise WebError(f"no run group {shown_name(name)!r}")
        docs = [(r.id, self.document(r)["rows"], self.rows(r)) for r in shards]   # held: ids stay theirs
        view_of = {id(row): view for _, doc_rows, views in docs for row, view in zip(doc_rows, views, strict=True)}
        rows = [(rid, view_of[id(row)]) for rid, row in merge_rows([(rid, doc_rows) for rid, doc_rows, _ in docs])]
        counts = dict.fromkeys(STATUSES, 0)
        for _, v in rows:
            counts[v.status] = counts.get(v.status, 0) + 1
        states = sorted({r.state for r in shards})
        gpus = sorted({r.gpu or r.device for r in shards})
        first = shards[0]
        summary = replace(first, id=shown_name(GROUP_PREFIX + name), key=GROUP_PREFIX + name, run_group=name,
                          shard=None, gpu=", ".join(gpus), rows=len(rows), counts=counts,
                          state=states[0] if len(states) == 1 else "mixed: " + ", ".join(states),
                          finished_at=max((r.finished_at or "") for r in shards) or None,
                          testlist=", ".join(sorted({r.testlist for r in shards})),
                          backend=", ".join(sorted({r.backend for r in shards})))
        return GroupPage(name=name, run=summary, shards=shards, rows=rows)

    def shape_rows(self, runs: list[str]) -> list[tuple[RunSummary, list[RowView]]]:
        out = []
        for run in runs:
            summary = self.resolve(run)
            out.append((summary, self.rows(summary)))
        return out

    def default_shape_runs(self, limit: int = 8) -> list[str]:
        """The newest run and the newest runs of the same testlist (other GPUs, other backends)."""
        runs = self.runs()
        if not runs:
            return []
        first = runs[0]
        same = [r.id for r in runs if r.testlist == first.testlist]
        return same[:limit]

    def roofline(self, run: str) -> RooflinePage:
        """The run's ok points and its ceilings: the GPU's measured peaks where its rows carry them
        (`pct_peak` is taken against those), else the datasheet's; the datasheet's are kept beside
        measured ones so the page can draw both."""
        summary = self.resolve(run)
        doc = self.document(summary)
        points = [r for r in self.rows(summary) if r.status == "ok" and r.tflops and r.intensity]
        compute: dict[str, float] = {}
        compute_measured: dict[str, bool] = {}
        memory_measured = False
        datasheet: dict[str, float] = {}
        memory: Optional[float] = None
        datasheet_memory: Optional[float] = None
        source: Optional[str] = None
        for r in doc["rows"]:
            peak = (r.get("metrics") or {}).get("peak")
            if not isinstance(peak, dict):
                continue
            cls = str(peak.get("compute_class") or "peak")
            sheet_tf, sheet_bw = _number(peak.get("tflops")), _number(peak.get("memory_gbps"))
            measured_tf, measured_bw = _number(peak.get("measured_tflops")), _number(peak.get("measured_memory_gbps"))
            tf = measured_tf or sheet_tf
            bw = measured_bw or sheet_bw
            if tf is not None:
                compute[cls] = tf
                compute_measured[cls] = measured_tf is not None
            if sheet_tf is not None:
                datasheet[cls] = sheet_tf
            if bw is not None:
                memory, memory_measured = bw, measured_bw is not None
            datasheet_memory = sheet_bw if sheet_bw is not None else datasheet_memory
            source = str(peak.get("source") or "") or source
        device = doc.get("run", {}).get("device") or {}
        if memory is None and isinstance(device, dict) and device.get("kind") not in (None, "cpu"):
            peaks = peaks_for(str(device.get("name") or ""))
            if peaks is not None:
                compute, memory, source = dict(peaks.tflops), peaks.memory_gbps, peaks.source
                compute_measured, memory_measured = {cls: False for cls in compute}, False
                datasheet, datasheet_memory = dict(compute), memory
        measured = compute != datasheet or memory != datasheet_memory
        return RooflinePage(run=summary, points=points, compute_tflops=clean(compute), memory_gbps=memory,
                            peak_source=clean(source), datasheet_tflops=clean(datasheet) if measured else {},
                            datasheet_memory_gbps=datasheet_memory if measured else None,
                            compute_measured=clean(compute_measured), memory_measured=memory_measured)

    def case(self, run: str, index: int) -> tuple[RunSummary, dict[str, Any]]:
        summary = self.resolve(run)
        for r in self.document(summary)["rows"]:
            if r.get("case_index") == index:
                return summary, case_detail(r)
        raise WebError(f"run {summary.id} has no case {index}")

    def cases(self, summary: RunSummary) -> list[dict[str, Any]]:
        """Every row's Case page data, not yet cleaned: write it through `safe.clean_json`."""
        rows = self.document(summary)["rows"]
        views = self.rows(summary)          # their notes, read once for the Run page and the Case data
        return [case_detail(r, cleaned=False, notes=v.notes) for r, v in zip(rows, views, strict=True)]

    def gpu_testlists(self, runs: Optional[list[RunSummary]] = None) -> list[tuple[str, list[RunSummary]]]:
        """Each testlist whose GPUs page has at least two runs (web/gpus.py `fleet_runs`), with them."""
        every = self.runs() if runs is None else runs
        out = []
        for testlist in sorted({r.testlist for r in every}):
            chosen = fleet_runs(every, testlist)
            if len(chosen) >= 2:
                out.append((testlist, chosen))
        return out

    def gpus_page(self, testlist: str, runs: Optional[list[str]] = None,
                  among: Optional[list[RunSummary]] = None) -> FleetPage:
        """The GPUs page of `testlist` (as pages show it): over the runs named, or the newest run of
        each GPU and backend of it (`fleet_runs`, from `among` when given: the static site's runs)."""
        if runs:
            chosen = [self.resolve(r) for r in runs]
            other = [r.id for r in chosen if r.testlist != testlist]
            if other:
                raise WebError(f"run {other[0]} is not a run of testlist {shown_name(testlist)!r}")
            chosen = list({r.id: r for r in chosen}.values())
            why = "the runs the link names"
        else:
            chosen = fleet_runs(self.runs() if among is None else among, testlist)
            if not chosen:
                raise WebError(f"no runs of testlist {shown_name(testlist)!r}")
            why = ("the newest run of each GPU and backend of this testlist (A/B runs and shards of a sweep "
                   "left out)")
        keyed = []
        for run in chosen:
            doc_rows = self.document(run)["rows"]
            views = self.rows(run)
            keyed.append((run, [(fleet_key(r), v) for r, v in zip(doc_rows, views, strict=True)]))
        return fleet_page(testlist, keyed, chosen=why)

    def model_page(self, runs: list[str], asks: Optional[list[ScenarioAsk]]) -> ModelPage:
        """The Model page of `runs` (web/model.py): each run's scenario (`asks`, one per run) written
        again by the catalog and timed by `report/estimate.py` over the run's rows; with no scenario
        asked, each run says which catalog checkpoints its rows cite (the form offers them)."""
        chosen = [self.resolve(r) for r in runs]
        names = [r.series for r in chosen]
        names = [n if names.count(n) == 1 else f"{n} ({r.id})" for n, r in zip(names, chosen, strict=True)]
        out: list[ModelRun] = []
        choices = []
        scenarios = {}
        for i, (run, name) in enumerate(zip(chosen, names, strict=True)):
            doc_rows = self.document(run)["rows"]
            choices.append(catalog_models({m for v in self.rows(run) for m in v.models}))
            if asks is None:
                why = None if choices[-1] else (f"run {run.id} holds no scenario cases: its rows cite no catalog "
                                                "checkpoint (`operatorx testlist serving` writes them)")
                out.append(ModelRun(run=run, name=name, message=why))
                continue
            ask = asks[i]
            if ask not in scenarios:
                scenarios[ask] = scenario_for(ask)
            out.append(model_run(run, name, doc_rows, scenarios[ask]))
        steps, classes = page_steps(out)
        return ModelPage(runs=out, asks=asks, choices=choices, steps=steps, classes=classes)

    def compare(self, a: str, b: str) -> ComparePage:
        run_a, run_b = self.resolve(a), self.resolve(b)
        doc_a, doc_b = self.document(run_a), self.document(run_b)
        where: dict[str, tuple[RowView, Optional[int], Optional[int]]] = {}
        for side, run, doc in (("a", run_a, doc_a), ("b", run_b, doc_b)):
            for v, r in zip(self.rows(run), doc["rows"], strict=False):
                key = case_key(r.get("op") or {})
                prev = where.get(key)
                ia = v.index if side == "a" else (prev[1] if prev else None)
                ib = v.index if side == "b" else (prev[2] if prev else None)
                keep = prev[0] if prev and (prev[0].scheme or not v.scheme) else v     # one that knows its scheme
                where[key] = (keep, ia, ib)
        comparison = compare_documents(doc_a, doc_b)
        cases = []
        verdicts: dict[str, int] = {}
        for c in comparison.cases:
            view, ia, ib = where.get(c.case_key, (None, None, None))
            verdicts[c.verdict] = verdicts.get(c.verdict, 0) + 1
            cases.append(CompareCase(
                case_key=c.case_key, label=str(c.label), family=view.family if view else "",
                m=view.m if view else None, index_a=ia, index_b=ib, a_latency_us=c.a_latency_us,
                b_latency_us=c.b_latency_us, ratio=c.ratio, ci_low=c.ci_low, ci_high=c.ci_high,
                p_value=c.p_value, q_value=c.q_value, verdict=str(c.verdict), flags=list(c.flags),
                numbers_verdict=c.numbers_verdict, verdict_why=c.verdict_why))
        return ComparePage(a=run_a, b=run_b, cases=cases, verdicts=verdicts,
                           flags=[clean_text(f) for f in comparison.flags])


_CASE_METRICS = ("latency_us", "method", "clock", "l2_state", "l2_verified", "noise", "summary_us", "samples_us",
                 "warmup", "stop_reason", "timing", "telemetry", "capped", "profile", "trace_path", "counters",
                 "perturbed", "profile_error", "backend_meta", "check", "host", "case_seconds", "scheme",
                 "flops", "min_bytes", "tflops", "gbps", "pct_peak", "peak", "rank_local", "ranks", "ab")


def fleet_key(r: dict[str, Any]) -> str:
    """A case's identity across runs of one testlist: its type and args (`case_key`) and its sources
    (two models may share a shape; each is its own case there)."""
    op = r.get("op") or {}
    return case_key(op) + "\n" + "\n".join(str(s) for s in op.get("sources") or [])


def case_detail(r: dict[str, Any], cleaned: bool = True, notes: Optional[list[str]] = None) -> dict[str, Any]:
    """Everything the Case page shows of one row (cleaned unless told); metrics it does not name go
    under `other`. `notes`: the row's notes when the caller has read them (`row_notes_of`). The kernel
    timeline (web/timeline.py) is built here, so the server and the static site draw the same one."""
    m = r.get("metrics") or {}
    metrics = {k: m[k] for k in _CASE_METRICS if k in m}
    other = {k: v for k, v in m.items() if k not in metrics}
    detail = {"index": r.get("case_index"), "label": r.get("label"), "status": r.get("status"),
              "error_kind": r.get("error_kind"), "message": r.get("message"), "side": r.get("side", ""),
              "op": r.get("op") or {}, "metrics": metrics, "other": other,
              "notes": notes if notes is not None else row_notes_of(r)}
    timeline = kernel_timeline(m.get("profile"))
    detail["kernel_timeline"] = timeline.to_json() if timeline else None
    return clean(detail) if cleaned else detail  # type: ignore[no-any-return]
