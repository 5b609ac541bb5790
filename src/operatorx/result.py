"""A row: one case's outcome, typed. The run produces rows; the store, reports and exports read them.

One model feeds every reader: the result document (`Row.to_json` / `Row.from_json`, an exact
round trip: the sweep ships rows from its workers as JSON), the DB columns, the tables, the CSV
and `docs/metrics.md` (generated from the field descriptions here and in result_parts.py:
`python -m operatorx.result --write`).

In Python a row's measurement is grouped into typed parts (`measured`, `rates`, `conditions`,
`ran`, `check`, `host`, ...). In the document they sit side by side in one flat `metrics` object,
under the keys readers have used since the first version (`metrics.latency_us`, `metrics.tflops`,
...): every field name below *is* its document key, except `Row.extra`, written `backend_meta`.
Keys a document carries that this version does not know are kept as they came (`Row.other`).

A new row's status agrees with its content (`status_problem`); a stored document loads as it was
written (`Row.from_json`), even where an earlier version wrote a row that breaks a rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Optional, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from operatorx.result_parts import (
    DOCUMENT,
    CaseSeconds,
    CheckResult,
    ClosedPart,
    Conditions,
    HostTime,
    Kernel,
    KernelProfile,
    Measured,
    MemoryCheck,
    OpenPart,
    Part,
    Peak,
    Placement,
    Rates,
    Summary,
    Telemetry,
    TimingInfo,
    Warmup,
    WhatRan,
    WorkerDevice,
    compute_rates,
    doc,
    json_safe,
    loading_document,
)
from operatorx.result_ranks import Ranks
from operatorx.spec import Case
from operatorx.spec.base import MAX_INT64
from operatorx.spec.shard import RankLocal
from operatorx.storable import MESSAGE_MAX_CHARS, TEXT_MAX_CHARS, capped, storable, storable_data

__all__ = ["Row", "Status", "ErrorKind", "Headline", "SCHEMA_VERSION", "Measured", "Summary", "Warmup",
           "TimingInfo", "Rates", "Peak", "Conditions", "Telemetry", "WhatRan", "KernelProfile", "Kernel",
           "CheckResult", "HostTime", "CaseSeconds", "WorkerDevice", "MemoryCheck", "Placement", "compute_rates",
           "json_safe", "BUSY_SPAN_THRESHOLD", "Part", "OpenPart", "ClosedPart", "Plan", "status_problem"]

SCHEMA_VERSION = "1"
Status = Literal["ok", "unsupported", "error", "missing"]
ErrorKind = Literal["exception", "timeout", "crashed", "cuda_fault", "oom", "leak", "check"]
Headline = Literal["span", "busy"]
BUSY_SPAN_THRESHOLD = 0.03
"""Busy and gaps are shown beside the span when they differ by more than this fraction of it."""


# --- the row --------------------------------------------------------------------------------------

_GROUPS: tuple[tuple[str, type[Part]], ...] = (("measured", Measured), ("rates", Rates),
                                               ("conditions", Conditions), ("ran", WhatRan))
_SINGLE: dict[str, str] = {"scheme": "scheme", "check": "check", "host": "host", "case_seconds": "case_seconds",
                           "worker": "worker", "extra": "backend_meta", "traceback": "traceback", "memory": "memory",
                           "worker_stderr_tail": "worker_stderr_tail", "failures": "failures", "ab": "ab",
                           "rank_local": "rank_local", "placement": "placement", "ranks": "ranks"}
"""Row field → its document key, for the row's own one-key parts."""
_GROUP_KEYS = {key: name for name, model in _GROUPS for key in model.model_fields}
_METRIC_FIELDS = frozenset([name for name, _ in _GROUPS] + list(_SINGLE))
"""Row fields that write keys of `metrics` (with `other`)."""
_SINGLE_BY_KEY = {key: field for field, key in _SINGLE.items()}


_STORABLE_ALREADY: dict[str, Any] = {"storable": True}
"""Validation context of a row whose strings the caller made storable (`Row.missing`)."""
_TEXT_TAILS = ("traceback", "worker_stderr_tail")
"""Free-text fields whose end matters (the failing frame, the last lines): capped keeping the end."""


def _storable_fields(data: dict[str, Any]) -> dict[str, Any]:
    """A row's input with every string storable (storable.py) and its free text capped: the one place
    a row's text is made safe, so the store, the document and the terminal all get the same text."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, str):
            value = storable(value)
            if key == "message":
                value = capped(value, MESSAGE_MAX_CHARS)
            elif key in _TEXT_TAILS:
                value = capped(value, TEXT_MAX_CHARS, keep_end=True)
        elif key == "failures" and isinstance(value, list):
            value = [capped(storable(v), MESSAGE_MAX_CHARS) if isinstance(v, str) else v for v in value]
        elif isinstance(value, (dict, list)):
            value = storable_data(value)
        out[key] = value
    return out


def _parse_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Row fields from a document's flat `metrics` object."""
    out: dict[str, Any] = {}
    grouped: dict[str, dict[str, Any]] = {}
    other: dict[str, Any] = {}
    for key, value in metrics.items():
        if key in _GROUP_KEYS:
            grouped.setdefault(_GROUP_KEYS[key], {})[key] = value
        elif key in _SINGLE_BY_KEY:
            out[_SINGLE_BY_KEY[key]] = value
        else:
            other[key] = value
    out.update(grouped)
    if other:
        out["other"] = other
    return out


class Row(BaseModel):
    """One case's outcome. Identity: `key()` = (case key, backend, side) inside a run."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    case: Case
    backend: str
    status: Status
    testlist: str
    case_index: int = Field(ge=0, le=MAX_INT64)
    """The case's index in its testlist (its first copy's, when the file repeats it)."""
    message: Optional[str] = None
    side: str = ""
    """Which side of an A/B (or multi-side) run the row belongs to; "" otherwise."""
    error_kind: Optional[ErrorKind] = None
    """Why an `error` row failed: exception, timeout, crashed, cuda_fault, oom, leak, check."""
    scheme: Optional[str] = doc("the case's quant scheme in short (`bf16`, `a=e4m3/fp32:1x128:dyn b=e4m3/...`)")
    measured: Optional[Measured] = None
    rates: Optional[Rates] = None
    conditions: Optional[Conditions] = None
    ran: Optional[WhatRan] = None
    check: Optional[CheckResult] = doc("the correctness check: `rel_error`, `bound`, `rows_checked`, `reference`, "
                                       "`checked`, `ok`")
    host: Optional[HostTime] = doc("with `--host`: host µs per call, `host_bound`, layers", "µs")
    case_seconds: Optional[CaseSeconds] = doc("wall seconds of the case's phases: `prepare_check`, `timing`, "
                                              "`profile`, `total`; and when it started (`started_unix_s`)", "s")
    worker: Optional[WorkerDevice] = doc("the device this row was measured on: `kind`, `name`, `uuid`, "
                                         "`pci_bus_id`, `index` where known")
    extra: dict[str, Any] = Field(default_factory=dict, description="what the backend chose (library path, quant "
                                  "method, kernels, graph or eager)", json_schema_extra={"unit": ""})
    traceback: Optional[str] = doc("the last frames of the exception of an `error` row")
    memory: Optional[MemoryCheck] = doc("memory held before the case and after its release, and the growth: "
                                        "a leak fails the row (`leak`) and replaces the worker")
    worker_stderr_tail: Optional[str] = doc("for a case whose worker hung, died or was stopped: the last lines "
                                            "the worker wrote to stderr (for a hang, its Python stacks, which it "
                                            "writes when the sweep asks before the kill)")
    failures: Optional[list[str]] = doc("each earlier failure of the case's worker (the sweep retries a case "
                                        "whose worker died; `crashed: ...`, `timeout: ...`)")
    ab: Optional[dict[str, Any]] = doc("rows of an `operatorx ab` run: the case's A/B result (both sides; per "
                                       "clock the paired median difference B−A, Hodges–Lehmann, with its "
                                       "interval and verdict, and `verdict_why` where a condition neither side "
                                       "controlled held it back)")
    rank_local: Optional[RankLocal] = doc("with `--rank-local`: the row timed one rank's shard of a split case, not "
                                          "the case: `world`, `rank`, `split` (`tp8`), `rule` (how the shard was "
                                          "cut, e.g. `row-parallel by role mlp.down_proj: k 33792 -> 4224`), "
                                          "`shard` (the args that ran); rates are the shard's")
    placement: Optional[Placement] = doc("with `--placements N` > 1: each placement's median, their spread, "
                                         "and how many were measured; `latency_us` is their median")
    ranks: Optional[Ranks] = doc("a multi-rank case (tp·dp = W > 1 run over W workers as one group): `world`, "
                                 "`split`, `latency_us_min`, `skew_us`, `capped_ranks`, `per_rank` (below); "
                                 "`latency_us` is the median of the slowest rank's per-iteration time")
    other: dict[str, Any] = Field(default_factory=dict)
    """Metrics keys this version does not know, kept as they came."""

    @model_validator(mode="before")
    @classmethod
    def _from_metrics(cls, data: Any, info: ValidationInfo) -> Any:
        """`Row(..., metrics={...})`: the flat document form is accepted and typed; and every text
        the row holds is made storable (`_storable_fields`), however the row was built (`missing`
        makes its few strings storable itself)."""
        if not isinstance(data, dict) or info.context is _STORABLE_ALREADY:
            return data
        if "metrics" in data:
            data = dict(data)
            metrics = data.pop("metrics") or {}
            if not isinstance(metrics, dict):
                raise ValueError("metrics: an object")
            data.update(_parse_metrics(json_safe(metrics)))
        return _storable_fields(data)

    @model_validator(mode="after")
    def _status_matches_content(self, info: ValidationInfo) -> Row:
        """A new row's status agrees with its content (`status_problem`); a stored document's row is
        taken as it was written, because documents from before these rules (an `error` row from
        before `error_kind` existed) must still load and round-trip."""
        if loading_document(info):
            return self
        problem = status_problem(self.status, measured=self.measured is not None, ab=self.ab is not None,
                                 error_kind=self.error_kind, message=self.message)
        if problem is not None:
            raise ValueError(f"row of case {self.case.label()!r} ({self.backend}): {problem}")
        return self

    # --- identity -------------------------------------------------------------------------------
    def key(self) -> tuple[str, str, str]:
        """The row's identity inside a run: (case key, backend, side)."""
        return self.case.key(), self.backend, self.side

    @classmethod
    def missing(cls, case: Case, backend: str, testlist: str, case_index: int, side: str = "") -> Row:
        """A planned case that has not finished (or never will: the run ended first)."""
        return cls.model_validate({"case": case, "backend": storable(backend), "status": "missing",
                                   "testlist": storable(testlist), "case_index": case_index, "side": storable(side)},
                                  context=_STORABLE_ALREADY)

    @staticmethod
    def missing_document(case: Case, backend: str, testlist: str, case_index: int, side: str = "") -> dict[str, Any]:
        """`Row.missing(...).to_json()`, built without the row: a plan of 10^6 cases is 10^6 of these."""
        return {"op": {"type": case.type, "args": case.args_dict(), "backend": storable(backend),
                       "sources": list(case.sources)},
                "label": case.label(), "status": "missing", "testlist": storable(testlist), "case_index": case_index,
                "side": storable(side), "error_kind": None, "metrics": {}}

    def label(self) -> str:
        """The case's label, and `[rank-local 0/8]` when the row timed one rank's shard of it."""
        shard = self.rank_local
        return self.case.label() + (f" [rank-local {shard.rank}/{shard.world}]" if shard is not None else "")

    def compare_key(self) -> str:
        """What a comparison matches rows by: the case key, and whether the row is a rank-local shard
        (a shard is never compared with the whole case)."""
        return self.case.key() + ("|rank_local" if self.rank_local is not None else "")

    # --- the numbers readers want -----------------------------------------------------------------
    @property
    def latency_us(self) -> Optional[float]:
        return self.measured.latency_us if self.measured else None

    @property
    def busy_us(self) -> Optional[float]:
        return self.measured.busy_us if self.measured else None

    @property
    def gaps_us(self) -> Optional[float]:
        return self.measured.gaps_us if self.measured else None

    @property
    def samples_us(self) -> list[float]:
        return list(self.measured.samples_us) if self.measured else []

    def busy_differs(self, threshold: float = BUSY_SPAN_THRESHOLD) -> bool:
        """Busy time is known and differs from the span by more than `threshold` of the span."""
        m = self.measured
        return m is not None and m.busy_us is not None and m.latency_us > 0 and \
            abs(m.latency_us - m.busy_us) > threshold * m.latency_us

    def headline_us(self, headline: Headline = "span") -> Optional[float]:
        """The time a table leads with: the span (default), or busy time where the timer gave it."""
        if headline == "busy" and self.busy_us is not None:
            return self.busy_us
        return self.latency_us

    def rates_at(self, headline: Headline = "span") -> Optional[Rates]:
        """The rates against the headline time: stored ones for the span, recomputed for busy time."""
        r = self.rates
        if r is None or headline == "span" or self.busy_us is None or not self.busy_us > 0 or r.flops is None \
                or r.min_bytes is None:
            return r
        return compute_rates(r.flops, r.min_bytes, self.busy_us, r.peak, r.collective_bytes, r.bus_factor,
                             r.cost_parts)

    @property
    def metrics(self) -> dict[str, Any]:
        """The flat `metrics` object of the document (a fresh dict: edit the row, not this)."""
        out: dict[str, Any] = {}
        if not self.other and self.model_fields_set.isdisjoint(_METRIC_FIELDS):
            return out                    # a planned row: none of its parts given (10^5 of them per plan)
        for name, _ in _GROUPS:
            part = getattr(self, name)
            if part is not None:
                out.update(part.dump())
        for field, key in _SINGLE.items():
            if field not in self.model_fields_set:
                continue
            value = getattr(self, field)
            out[key] = value.dump() if isinstance(value, Part) else \
                value.model_dump(mode="json") if isinstance(value, BaseModel) else value
        out.update(self.other)
        return out

    # --- the document form ----------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The row as the result document carries it (case-format.md, "Results")."""
        out: dict[str, Any] = {
            "op": {"type": self.case.type, "args": self.case.args_dict(), "backend": self.backend,
                   "sources": list(self.case.sources)},
            "label": self.label(),
            "status": self.status,
            "testlist": self.testlist,
            "case_index": self.case_index,
            "side": self.side,
            "error_kind": self.error_kind,
            "metrics": self.metrics,
        }
        if self.message is not None:
            out["message"] = self.message
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Row:
        """The row of a document (`to_json`'s form, or an older one without side/error_kind)."""
        op = d["op"]
        case = Case.model_validate({"type": op["type"], "args": op["args"], "sources": op.get("sources", [])})
        data: dict[str, Any] = {"case": case, "backend": op["backend"], "status": d["status"],
                                "testlist": d.get("testlist", ""), "case_index": d["case_index"],
                                "message": d.get("message"), "side": d.get("side") or "",
                                "error_kind": d.get("error_kind")}
        data.update(_parse_metrics(d.get("metrics") or {}))
        return cls.model_validate(data, context=DOCUMENT)


def status_problem(status: str, *, measured: bool, ab: bool, error_kind: Optional[str],
                   message: Optional[str]) -> Optional[str]:
    """What is wrong with a row's status against its content, or None. The rules:
    - `ok` has a measurement (`measured`, or `ab` for an A/B row) and no error kind;
    - `error` has an error kind and a message; a measurement may stay (taken before a leak or a
      failed release), so an error never hides what was measured;
    - `unsupported` has its reason (the message), no measurement and no error kind;
    - `missing` (planned, not finished) has no measurement and no error kind.
    Why: every reader takes the status at its word (counts, tables, compare), so an `ok` row with
    no number, or an error with no kind, would be shown as something it is not."""
    if status == "ok":
        if not (measured or ab):
            return "status ok needs a measurement (measured, or ab for an A/B row)"
        if error_kind is not None:
            return f"status ok with error_kind {error_kind!r}: only an error row has a kind"
        return None
    if status == "error":
        if error_kind is None:
            return "status error needs an error_kind"
        return None if message else "status error needs a message"
    if measured:
        return f"status {status} with a measurement: only ok (or error) rows carry one"
    if error_kind is not None:
        return f"status {status} with error_kind {error_kind!r}: only an error row has a kind"
    if status == "unsupported" and not message:
        return "status unsupported needs its reason (message)"
    return None


class Plan(Sequence[dict[str, Any]]):
    """A run's planned rows (each case `missing`), as the store takes them: each row's document is
    built when it is stored, and no Row object is made (10^6 planned Rows held 1.8 GB; docs/benchmarks.md,
    "Scale of a testlist"). Indexing gives the documents; `rows()` the rows, for a reader that wants them."""

    def __init__(self, chosen: Sequence[tuple[int, Case]], backend: str, testlist: str, side: str = "") -> None:
        self.chosen, self.backend, self.testlist, self.side = chosen, backend, testlist, side

    def __len__(self) -> int:
        return len(self.chosen)

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[dict[str, Any]]: ...

    def __getitem__(self, i: int | slice) -> dict[str, Any] | Sequence[dict[str, Any]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        index, case = self.chosen[i]
        return Row.missing_document(case, self.backend, self.testlist, index, self.side)

    def identities(self) -> list[tuple[str, str, str]]:
        """Each row's identity, `Row.key()`: (case key, backend, side)."""
        backend, side = storable(self.backend), storable(self.side)
        return [(case.key(), backend, side) for _, case in self.chosen]

    def rows(self) -> list[Row]:
        return [Row.missing(case, self.backend, self.testlist, index, self.side) for index, case in self.chosen]


if __name__ == "__main__":  # pragma: no cover - `python -m operatorx.result [--write]`
    import sys

    from operatorx.report.metrics_doc import main

    sys.exit(main(sys.argv[1:]))
