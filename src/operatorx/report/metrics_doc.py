"""docs/metrics.md, generated from the row model (operatorx.result): every key, its unit and meaning.

`python -m operatorx.result` prints it; `--write` rewrites docs/metrics.md; `--check` exits 1 when
the committed file differs (a test runs the same comparison).
"""

from __future__ import annotations

import sys
import typing
from pathlib import Path
from typing import Any, Optional, Union

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from operatorx import result as rm
from operatorx.result_ranks import PlacementGroup, RankLine, Ranks

__all__ = ["metrics_markdown", "DOC_PATH", "main"]

DOC_PATH = Path(__file__).resolve().parents[3] / "docs" / "metrics.md"

_HEAD = """\
# What a row's `metrics` holds

<!-- Generated from src/operatorx/result.py and result_parts.py by `python -m operatorx.result --write`; edit the field
descriptions there, not this file (tests/test_result.py fails when the two differ). -->

A result document has one object per case (`rows[i]`): `op` (type, args, backend, sources), `label`,
`status` (`ok`, `unsupported`, `error`, `missing`: planned and not finished), `testlist`,
`case_index`, `side` (which side of an A/B; empty otherwise), `error_kind` (for `error`: `exception`,
`timeout`, `crashed`, `cuda_fault`, `oom`, `leak`, `check`), `message`, and `metrics`, described
here. Every number can be traced to the raw samples stored beside it. Keys are written only when the
row has them: an `unsupported` row has no `latency_us`.

In Python (`operatorx.result.Row`) the keys are grouped into typed parts, named in each heading;
in the document they sit side by side in `metrics`.

**Span or busy.** `latency_us` is the span of a call, from its first kernel's start to its last
kernel's end: what a caller waits for, and what a CUDA graph or a server replays. `busy_us` is the
time some kernel of the call was running: what Nsight Compute's sum of kernel durations compares
with. They differ by the GPU's idle gaps between the call's kernels (about 1.3 µs per boundary on
an H200 in eager mode). Tables show busy and gaps beside the span where they differ by more than
3%; `--report busy` makes busy time the headline (and the rates follow it).

**Comparing runs.** The gaps are not the op's alone: their level belongs to the process and holds
for its life. On the H200 it can differ from one process to the next by 0.1-0.2 µs per kernel
boundary (a 10-kernel dynamic-quant FP8 call: 8.2 or 9.4 µs of gaps, 2-4% of a 40 µs span),
whatever the flush, the stream, where the tensors lie, ASLR or a second timer (docs/benchmarks.md
§17, §21). Processes with no profiler at all show the same levels (§22): the spread is the GPU's.
Each worker reads its level when it starts (`launch_gap_us` below) and `results compare` flags a
multi-kernel case timed at two levels. Two timings by the same worker agree within 1% (p95 0.6-0.8%
over the accuracy set); between two runs, compare multi-kernel calls by busy time, which carries no
such level.

**Where the operands lie.** The same kernel on the same data can take several % longer at one
device address than at another (a bf16 256x4096x4096 GEMM: 15.2 to 16.9 µs over three placements
on the H200). One run's allocator puts a case's tensors at one address, so two runs that allocate in
another order (with and without `--host`, two builds) can disagree on single-kernel cases by up to
12%. `--placements N` prepares each case N times at other addresses and reports the median over
them (`placement` below); with 3, the same pair of runs agrees within 1% at p95 (docs/benchmarks.md
§25). It costs N-fold timing, so sweeps default to 1 and `ab` to 3; `results compare` says when
placement was not controlled, and neither `ab` nor `compare` calls a difference inside the
placement spread faster or slower.

**Verdicts.** `results compare` and `ab` take one estimator for the point and its interval, so the point
always lies inside it: the Hodges–Lehmann shift, of log times between two runs (B/A: the median of
every pairwise ratio) and of the paired batch differences in an A/B (B−A: the paired median
difference, the median of their pairwise averages). A difference that a condition neither side
controlled could cause by itself is never `faster` or `slower`. The placement spread and a
launch-gap level difference widen the band the difference must leave; CPU contention holds both
verdicts back. The output names the condition (`verdict_why`, docs/compare.md). Every note a table
gives a row goes with it, whole, into the compare output, the pages and the exports.

**What the profiler adds.** In `kernels` and `graph` mode CUPTI records every kernel, and that
recording lengthens a multi-kernel call on the GPU. On the H200, one 10-kernel FP8 call ran 2-4%
longer with recording on than paused in the same process, a 9-kernel one 1%, and a chain of tiny
kernels +0.2 µs a kernel (§22). Every CUPTI-based span carries this, Nsight Systems' too.
`--timing events` times without CUPTI. Events read the wall time of a call, so whether the cost lies
between the kernels or inside them was not told apart.
"""

_SECTIONS: tuple[tuple[str, str, type[BaseModel]], ...] = (
    ("The number and how it was taken", "Row.measured", rm.Measured),
    ("Rates", "Row.rates", rm.Rates),
    ("Conditions", "Row.conditions", rm.Conditions),
    ("What ran", "Row.ran", rm.WhatRan),
)
_ROW_KEYS = ("scheme", "check", "host", "case_seconds", "worker", "extra", "rank_local", "traceback", "memory",
             "worker_stderr_tail", "failures", "ab", "ranks", "placement")
_PARTS: tuple[tuple[str, type[BaseModel]], ...] = (
    ("`summary_us`", rm.Summary), ("`warmup`", rm.Warmup), ("`timing`", rm.TimingInfo), ("`peak`", rm.Peak),
    ("`telemetry`", rm.Telemetry), ("`profile`", rm.KernelProfile), ("`profile.kernels[]`", rm.Kernel),
    ("`check`", rm.CheckResult), ("`host`", rm.HostTime), ("`case_seconds`", rm.CaseSeconds),
    ("`worker`", rm.WorkerDevice), ("`memory`", rm.MemoryCheck),
    ("`ranks`", Ranks), ("`ranks.per_rank[]`", RankLine),
    ("`ranks.placement_group`", PlacementGroup), ("`placement`", rm.Placement),
)


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin is Union or origin is Optional:
        return _type_name(args[0]) if len(args) == 1 else " or ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return " or ".join(f"`{a}`" for a in typing.get_args(annotation))
    if origin in (list, tuple):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return "object"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    return {float: "number", int: "integer", str: "text", bool: "true/false"}.get(annotation, str(annotation))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _line(key: str, info: FieldInfo) -> str:
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    unit = str(extra.get("unit") or "")
    return (f"| `{key}` | {_type_name(info.annotation)} | {unit or '-'} | "
            f"{_cell(info.description or '')} |")


def _table(fields: list[tuple[str, FieldInfo]]) -> list[str]:
    return ["| key | type | unit | meaning |", "| --- | --- | --- | --- |", *(_line(k, f) for k, f in fields)]


def metrics_markdown() -> str:
    """The text of docs/metrics.md."""
    lines = [_HEAD]
    for title, where, model in _SECTIONS:
        lines += [f"## {title} (`{where}`)", ""]
        doc = (model.__doc__ or "").strip()
        if doc and not doc.startswith(model.__name__ + "("):
            lines += [doc, ""]
        lines += [*_table(list(model.model_fields.items())), ""]
    row_fields = rm.Row.model_fields
    lines += ["## The rest of the row (fields of `Row`)", "",
              "`Row.extra` is written `backend_meta`; the others under their own names. Keys this version "
              "does not know are kept as they came (`Row.other`).", ""]
    lines += [*_table([("backend_meta" if k == "extra" else k, row_fields[k]) for k in _ROW_KEYS]), ""]
    lines += ["## Inside the objects", "",
              "Objects marked open (`telemetry`, `profile`, ...) keep keys their measuring code adds beyond "
              "these. The others are closed: a new row with a key not listed here is refused, while a stored "
              "document's keys from an earlier version load and are kept as they came.", ""]
    for title, model in _PARTS:
        open_part = issubclass(model, rm.OpenPart)
        lines += [f"### {title}{' (open)' if open_part else ''}", "", *_table(list(model.model_fields.items())), ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = metrics_markdown()
    if "--write" in argv:
        DOC_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {DOC_PATH}")
        return 0
    if "--check" in argv:
        same = DOC_PATH.is_file() and DOC_PATH.read_text(encoding="utf-8") == text
        if not same:
            print(f"{DOC_PATH} differs from the row model: run `python -m operatorx.result --write`",
                  file=sys.stderr)
        return 0 if same else 1
    sys.stdout.write(text)
    return 0
