"""What the pages show, as typed data: built from a run summary (`Store.list_runs()`) or a row of a
result document (`Row.to_json()`), cleaned (web/safe.py) on the way in. Pages get these through
`to_json()`; nothing here reads the database."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from operatorx.shown import shown_values
from operatorx.web.safe import clean, clean_text, shown_name

__all__ = ["RunSummary", "RowView", "ReasonGroup", "CompareCase", "run_summary", "row_view", "case_key",
           "reason_groups", "STATUSES", "ab_view", "row_notes_of"]

STATUSES = ("ok", "unsupported", "error", "missing")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _float(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class RunSummary:
    id: str
    started_at: str
    finished_at: Optional[str]
    state: str
    testlist: str
    backend: str
    device: str
    gpu: Optional[str]
    driver: Optional[str]
    run_group: Optional[str]
    shard: Optional[str]
    rows: int
    counts: Optional[dict[str, int]]     # None where the store does not count by status
    key: str
    """The run id as stored, for reading the store only; `id` is its `shown_name`, which is what pages,
    links, file names and page data carry (an ingested id may hold ESC, bidi or 50,000 characters)."""
    kind: str = "run"                    # run, or ab (an A/B in one process, stored as a run)
    versions: dict[str, str] = field(default_factory=dict)
    """What it ran with, where recorded: torch, vllm, operatorx, git_commit (the pairing rule, web/pairs.py)."""

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        del out["key"]
        return out

    @property
    def series(self) -> str:
        """How a line or a side of a comparison names this run: GPU (or device) and backend."""
        return f"{self.gpu or self.device} · {self.backend}"


def run_summary(r: dict[str, Any]) -> RunSummary:
    """A run of `Store.list_runs()`, cleaned; keys a store does not give read as empty. The id is
    shown by `shown_name` (never stripped: two ids must not show as one) and kept as stored in `key`."""
    counts = r.get("counts")
    return RunSummary(
        id=shown_name(str(r["id"])), key=str(r["id"]), started_at=clean_text(str(r.get("started_at") or "")),
        finished_at=clean_text(str(r["finished_at"])) if r.get("finished_at") else None,
        state=clean_text(str(r.get("state") or "")), testlist=clean_text(str(r.get("testlist") or "")),
        backend=clean_text(str(r.get("backend") or "")), device=clean_text(str(r.get("device") or "")),
        gpu=clean_text(str(r["gpu"])) if r.get("gpu") else None,
        driver=clean_text(str(r["driver"])) if r.get("driver") else None,
        run_group=clean_text(str(r["run_group"])) if r.get("run_group") else None,
        shard=clean_text(str(r["shard"])) if r.get("shard") else None,
        rows=int(r.get("rows") or 0),
        counts={s: int(counts.get(s) or 0) for s in STATUSES} if isinstance(counts, dict) else None,
        kind=clean_text(str(r.get("kind") or "run")),
        versions={clean_text(str(k)): clean_text(str(v)) for k, v in (r.get("versions") or {}).items() if v})


@dataclass(frozen=True)
class RowView:
    """One row as the Run, Shape and Roofline pages use it (no samples: those are the Case page's)."""
    index: int
    label: str
    type: str
    status: str
    error_kind: Optional[str]
    message: str
    backend: str
    side: str
    scheme: str
    m: Optional[int]                   # GEMM M, or MoE tokens: the size the Shape page plots against
    family: str                        # the case with its M left out: `gemm Mx7168x2048 bf16`
    models: list[str]
    roles: list[str]
    sources: list[str]
    shown: dict[str, Optional[float]]  # every shown metric (shown.py) by key: latency_us, tflops, ...
    flops: Optional[float]
    min_bytes: Optional[float]
    intensity: Optional[float]         # FLOP per byte moved (flops / min_bytes)
    stop_reason: Optional[str]
    noise: Optional[float]
    capped: bool
    clock: Optional[str]
    world: Optional[int] = None
    """A multi-rank row's ranks (`metrics.ranks.world`); None for a single-rank row."""
    split: Optional[str] = None
    skew_us: Optional[float] = None
    """A multi-rank row's median spread between its slowest and fastest rank (`metrics.ranks.skew_us`)."""
    notes: list[str] = field(default_factory=list)
    """Every note the terminal table gives the row (report/table.py: `row_notes`), and an A/B row's."""
    ab: Optional[dict[str, Any]] = None
    """An `ab` run's row: `ab_view`."""

    @property
    def latency_us(self) -> Optional[float]:
        return self.shown.get("latency_us")

    @property
    def tflops(self) -> Optional[float]:
        return self.shown.get("tflops")

    def to_json(self) -> dict[str, Any]:
        """The view's fields, the shown metrics among them by key (shallow: the lists are the view's own)."""
        out = {k: v for k, v in self.__dict__.items() if k != "shown"}
        return {**out, **self.shown}


def case_key(op: dict[str, Any]) -> str:
    """The case's identity as `Case.key()` writes it, from the document's `op`."""
    return json.dumps({"type": op.get("type"), "args": op.get("args")}, sort_keys=True, separators=(",", ":"))


@functools.lru_cache(maxsize=65536)
def _size_family(case_key: str) -> tuple[Optional[int], Optional[str]]:
    """(the size the Shape page plots against, the family label) as the case's op type answers them;
    (None, None) for a row this version cannot read as a case."""
    from pydantic import ValidationError

    from operatorx.spec import Case

    try:
        data = json.loads(case_key)
        case = Case.model_validate({"type": data["type"], "args": data["args"]})
    except (ValidationError, ValueError, KeyError, TypeError, RecursionError):
        return None, None
    return case.args.size(), case.args.family()


def _family(op: dict[str, Any], label: str, scheme: str, rank_local: bool) -> tuple[Optional[int], str]:
    size, family = _size_family(case_key(op))
    family = family or label
    if rank_local:                 # a shard's line is never drawn through the whole layer's
        family += " [rank-local]"
    return size, f"{family} {scheme}".strip()


def _split_source(source: str) -> tuple[str, str]:
    """`deepseek-ai/DeepSeek-V3/self_attn.q_b_proj` -> (`deepseek-ai/DeepSeek-V3`, `self_attn.q_b_proj`)."""
    model, _, role = source.rpartition("/")
    return (model, role) if model else (source, "")


_AB_CLOCK_KEYS = ("a_us", "b_us", "diff_us", "ci_low_us", "ci_high_us", "confidence", "pairs", "verdict",
                  "numbers_verdict", "verdict_why", "estimate")


def ab_view(ab: Any) -> Optional[dict[str, Any]]:
    """What the Run page shows of an A/B row, cleaned: per clock (`host`, `device`) both sides' medians,
    the paired median difference B−A with its interval, the verdict and why it was held back; the
    outputs' comparison; each side's spec."""
    if not isinstance(ab, dict):
        return None
    raw_sides = ab.get("sides")
    sides: dict[str, Any] = raw_sides if isinstance(raw_sides, dict) else {}
    outputs = ab.get("outputs")

    def spec(side: str) -> Any:
        info = sides.get(side)
        return info.get("spec") if isinstance(info, dict) else None

    out: dict[str, Any] = {
        "outputs": str(outputs.get("result")) if isinstance(outputs, dict) and outputs.get("result") else None,
        "a": spec("a"), "b": spec("b")}
    for clock in ("host", "device"):
        d = ab.get(clock)
        out[clock] = {k: d.get(k) for k in _AB_CLOCK_KEYS} if isinstance(d, dict) else None
    return clean(out)  # type: ignore[no-any-return]


_SAMPLE_KEYS = ("samples_us", "busy_samples_us")


def row_notes_of(r: dict[str, Any]) -> list[str]:
    """The row's notes as the terminal table gives them (`row_notes`), an A/B row's after them; for a
    row this version cannot read, only its message. The samples are left out of the parse: no note
    reads them, and they are most of a row's size."""
    from pydantic import ValidationError

    from operatorx.report.ab import ab_notes
    from operatorx.report.table import row_notes
    from operatorx.result import Row

    m = r.get("metrics") or {}
    light = {**r, "metrics": {k: v for k, v in m.items() if k not in _SAMPLE_KEYS}} if isinstance(m, dict) else r
    try:
        notes = row_notes(Row.from_json(light))
    except (ValidationError, ValueError, KeyError, TypeError):
        notes = [str(r["message"])] if r.get("message") else []
    ab = m.get("ab") if isinstance(m, dict) else None
    if isinstance(ab, dict):
        notes += [n for n in ab_notes(ab) if n not in notes]
    return [clean_text(n) for n in notes]


def row_view(r: dict[str, Any]) -> RowView:
    from operatorx.report.ranks import ranks_of

    op = r.get("op") or {}
    m = r.get("metrics") or {}
    op_type = str(op.get("type", ""))
    label = clean_text(str(r.get("label") or op_type))
    scheme = clean_text(str(m.get("scheme") or ""))
    size, family = _family(op, label, scheme, isinstance(m.get("rank_local"), dict))
    sources = [clean_text(str(s)) for s in op.get("sources") or []]
    split = [_split_source(s) for s in sources]
    flops, min_bytes = _float(m.get("flops")), _float(m.get("min_bytes"))
    ranks = ranks_of(m)
    return RowView(
        index=int(r.get("case_index") or 0), label=label, type=clean_text(op_type),
        status=clean_text(str(r.get("status") or "")),
        error_kind=clean_text(str(r["error_kind"])) if r.get("error_kind") else None,
        message=clean_text(str(r.get("message") or "")), backend=clean_text(str(op.get("backend") or "")),
        side=clean_text(str(r.get("side") or "")), scheme=scheme, m=size, family=family,
        models=sorted({s[0] for s in split}), roles=sorted({s[1] for s in split if s[1]}), sources=sources,
        shown=shown_values(m), flops=flops, min_bytes=min_bytes,
        intensity=flops / min_bytes if flops and min_bytes else None,
        stop_reason=clean_text(str(m["stop_reason"])) if m.get("stop_reason") else None,
        noise=_float(m.get("noise")), capped=bool(m.get("capped")),
        clock=clean_text(str(m["clock"])) if m.get("clock") else None,
        world=ranks.world if ranks else None, split=clean_text(ranks.split) if ranks else None,
        skew_us=ranks.skew_us if ranks else None, notes=row_notes_of(r),
        ab=ab_view(m.get("ab")))


@dataclass(frozen=True)
class ReasonGroup:
    """Rows that did not run for the same reason (numbers in the message set aside)."""
    status: str
    error_kind: Optional[str]
    example: str
    count: int
    indexes: list[int]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def reason_groups(rows: list[RowView]) -> list[ReasonGroup]:
    """Unsupported and error rows grouped by status, kind and message shape, largest group first."""
    groups: dict[tuple[str, str, str], list[RowView]] = {}
    for r in rows:
        if r.status in ("unsupported", "error"):
            groups.setdefault((r.status, r.error_kind or "", _NUMBER.sub("#", r.message)), []).append(r)
    out = [ReasonGroup(status=k[0], error_kind=k[1] or None, example=v[0].message or "(no message)",
                       count=len(v), indexes=[r.index for r in v]) for k, v in groups.items()]
    return sorted(out, key=lambda g: (-g.count, g.status, g.example))


@dataclass(frozen=True)
class CompareCase:
    """One case of `compare_documents`, with where it sits in each run and its size for the plot."""
    case_key: str
    label: str
    family: str
    m: Optional[int]
    index_a: Optional[int]
    index_b: Optional[int]
    a_latency_us: Optional[float]
    b_latency_us: Optional[float]
    ratio: Optional[float]
    ci_low: Optional[float]
    ci_high: Optional[float]
    p_value: Optional[float]
    q_value: Optional[float]
    verdict: str
    flags: list[str]
    numbers_verdict: Optional[str] = None
    """The verdict of the numbers alone, where a condition neither run controlled changed it."""
    verdict_why: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        return clean(asdict(self))  # type: ignore[no-any-return]
