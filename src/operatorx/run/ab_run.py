"""An A/B over a testlist, stored like a run: one row per case, each committed when its case ends.

The run record says `kind: "ab"` with both sides' specs; each row's `metrics["ab"]` is the case's
`ABResult.to_json()` (both sides' checks, the output comparison, host and device differences with
their intervals and verdicts, all samples). `operatorx results show` prints such a run as the A/B
table; the result document is written beside run documents.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from operatorx.platform import describe_device
from operatorx.result import Row
from operatorx.run.ab import ABSettings, run_ab_case
from operatorx.run.ab_spec import Side
from operatorx.run.metadata import run_info
from operatorx.run.sweep import new_run_id, now_utc
from operatorx.spec import Case
from operatorx.store import Store, write_json_atomic

__all__ = ["ABRun", "run_ab"]


@dataclass
class ABRun:
    run_id: str
    document_path: Path
    results: list[dict[str, Any]] = field(default_factory=list)


def run_ab(cases: list[tuple[int, Case]], a: Side, b: Side, device: str, settings: ABSettings, testlist: str,
           db: str, results_dir: Path, on_case: Optional[Callable[[int, Case], None]] = None,
           on_result: Optional[Callable[[list[dict[str, Any]]], None]] = None) -> ABRun:
    """Every case through both sides; rows stored as they end, the document written at the end
    (also when interrupted: a crash loses at most the case in flight)."""
    run_id = new_run_id()
    store = Store(db)
    info = run_info(describe_device(device))
    info.update({"kind": "ab", "a": a.spec, "b": b.spec, "device_kind": device, "cases_selected": len(cases),
                 "ab_settings": {k: v for k, v in asdict(settings).items() if k not in ("host", "timing")},
                 "host_timing": settings.host.to_json(), "timing": settings.timing.to_json()})
    store.begin_run(run_id, now_utc(), testlist, f"ab: {a.spec} | {b.spec}", device, info)
    out = ABRun(run_id=run_id, document_path=results_dir / f"{run_id}.json")
    state = "interrupted"
    try:
        for index, case in cases:
            if on_case is not None:
                on_case(index, case)
            result = run_ab_case(case, a, b, device, settings).to_json()
            out.results.append({"case_index": index, **result})
            store.add_row(run_id, Row(case=case, backend=f"ab: {a.spec} | {b.spec}", status=result["status"],
                                      testlist=testlist, case_index=index, message=result.get("message"),
                                      metrics={"ab": result}))
            if on_result is not None:
                on_result(out.results)
        state = "finished"
    finally:
        store.finish_run(run_id, now_utc(), state)
        write_json_atomic(store.document(run_id), out.document_path)
    return out
