"""A run: load and check the whole testlist first, then each case in turn, each row committed.

An invalid testlist stops here, before the database is touched: nothing runs, nothing is stored.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional, Protocol

from operatorx.backends import backend_names
from operatorx.backends.py_file import is_user_spec
from operatorx.measure import HostClockTiming, Telemetry
from operatorx.platform import describe_device, peaks_for, resolve_device
from operatorx.result import Row
from operatorx.run.case import CaseRunner, Timer
from operatorx.run.config import RunConfig
from operatorx.run.metadata import run_info
from operatorx.spec import Case, load_testlist, resolve_testlist
from operatorx.store import Store, write_json_atomic

__all__ = ["Reporter", "RunOutcome", "new_run_id", "now_utc", "select_cases", "run_testlist"]


class Reporter(Protocol):
    def start(self, run_id: str, total: int) -> None: ...
    def case_started(self, case: Case, index: int) -> None: ...
    def case_done(self, row: Row) -> None: ...
    def finish(self) -> None: ...


class _Silent:
    def start(self, run_id: str, total: int) -> None: ...
    def case_started(self, case: Case, index: int) -> None: ...
    def case_done(self, row: Row) -> None: ...
    def finish(self) -> None: ...


@dataclass
class RunOutcome:
    run_id: str
    document_path: Path
    rows: list[Row] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.rows)


def now_utc() -> str:
    """The time stamps of runs: UTC, ISO 8601, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_run_id() -> str:
    """`YYYYmmdd-HHMMSS-` + 6 hex digits: sortable by start time, unique across machines."""
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def select_cases(cases: list[Case], text: Optional[str], limit: Optional[int]) -> list[tuple[int, Case]]:
    """(index in the testlist, case) for cases whose label, scheme or sources contain `text`."""
    chosen = [(i, c) for i, c in enumerate(cases)
              if text is None or any(text in s for s in (c.label(), c.scheme(), *c.sources))]
    return chosen[:limit] if limit is not None else chosen


def _timer(config: RunConfig, device_kind: str, l2_bytes: Optional[int], telemetry: Telemetry) -> Timer:
    if device_kind == "cpu":
        return HostClockTiming(config.timing)
    from operatorx.measure.device_timer import device_timer

    return device_timer(config.timing, l2_bytes, telemetry.max_sm_clock_hz())


def run_testlist(config: RunConfig, reporter: Optional[Reporter] = None) -> RunOutcome:
    reporter = reporter or _Silent()
    path = resolve_testlist(config.testlist)
    cases = load_testlist(path)                       # raises TestlistError: nothing stored
    chosen = select_cases(cases, config.filter, config.limit)
    testlist_name = config.testlist
    if not is_user_spec(config.backend) and config.backend not in backend_names():
        raise ValueError(f"--backend {config.backend}: no such backend (known: {', '.join(backend_names())}; "
                         "or py:FILE.py:FUNC, mod:PKG.MOD:FUNC@DIR)")

    device_kind = resolve_device(config.device)
    device = describe_device(device_kind)
    telemetry = Telemetry.for_torch_device(0) if device_kind == "cuda" else Telemetry(None)
    timer = _timer(config, device_kind, device.l2_bytes, telemetry)
    run_id = config.run_id or new_run_id()
    l2_check = None
    if device_kind == "cuda" and config.check_l2:
        from operatorx.measure.l2_check import check_l2_states

        l2_check = check_l2_states(device.l2_bytes, config.timing.l2_state, telemetry.max_sm_clock_hz())
    runner = CaseRunner(config=config, device=device, timer=timer, telemetry=telemetry, l2_check=l2_check,
                        run_id=run_id, peaks=peaks_for(device.name) if device_kind == "cuda" else None,
                        testlist=testlist_name)

    store = Store(config.db)
    info = run_info(device)
    info.update({"testlist_path": str(path), "cases_in_testlist": len(cases), "cases_selected": len(chosen),
                 "filter": config.filter, "limit": config.limit, "timing": config.timing.to_json(),
                 "l2_check": l2_check,
                 "device_kind": device_kind})
    store.begin_run(run_id, now_utc(), testlist_name, config.backend, device_kind, info)
    outcome = RunOutcome(run_id=run_id, document_path=config.results_dir / f"{run_id}.json")
    reporter.start(run_id, len(chosen))
    state = "interrupted"
    try:
        for index, case in chosen:
            reporter.case_started(case, index)
            row = runner.run(case, index)
            store.add_row(run_id, row)
            outcome.rows.append(row)
            reporter.case_done(row)
        state = "finished"
    finally:
        store.finish_run(run_id, now_utc(), state)
        write_json_atomic(store.document(run_id), outcome.document_path)
        reporter.finish()
    return outcome
