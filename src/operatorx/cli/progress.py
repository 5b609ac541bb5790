"""What a run shows while it goes: a progress bar with rate, ETA and each worker's case on a
terminal; one plain line per finished case and a summary every 30 s in a log (CI, Slurm, nohup).

Every string that comes from a case, a backend or a worker is made inert before printing
(report/safe.py): a message cannot restyle or rewrite the terminal.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Optional

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from operatorx.report.safe import plain

if TYPE_CHECKING:
    from operatorx.result import Row
    from operatorx.spec import Case

__all__ = ["make_reporter", "BarReporter", "LogReporter"]

SUMMARY_EVERY_S = 30.0


def _latency(row: Row) -> str:
    return f"{row.latency_us:.2f} us" if row.latency_us is not None else "-"


class _Counts:
    def __init__(self) -> None:
        self.by_status: dict[str, int] = {}
        self.done = 0
        self.t0 = time.monotonic()

    def add(self, row: Row) -> None:
        self.by_status[row.status] = self.by_status.get(row.status, 0) + 1
        self.done += 1

    def rate(self) -> float:
        return self.done / max(1e-9, time.monotonic() - self.t0)

    def text(self) -> str:
        return ", ".join(f"{n} {s}" for s, n in sorted(self.by_status.items())) or "nothing yet"


class LogReporter:
    """Plain lines, flushed: what a log file or a CI console can show."""

    def __init__(self, console: Console, summary_every_s: float = SUMMARY_EVERY_S) -> None:
        self.console, self.summary_every_s = console, summary_every_s
        self.counts = _Counts()
        self.total = 0
        self._last_summary = time.monotonic()

    def _line(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def start(self, run_id: str, total: int, slots: list[str]) -> None:
        self.total = total
        self.counts = _Counts()
        self._line(f"run {run_id}: {total} case{'s' if total != 1 else ''} on {len(slots)} worker"
                   f"{'s' if len(slots) != 1 else ''} ({', '.join(slots)})")

    def worker_ready(self, slot: str, info: dict[str, Any]) -> None:
        device = (info.get("device") or {}).get("name", "?")
        self._line(f"{slot}: ready on {plain(device)}")

    def case_started(self, slot: str, index: int, case: Case) -> None:
        self._maybe_summary()

    def case_done(self, slot: str, row: Row) -> None:
        self.counts.add(row)
        reason = f"  {plain(row.message)[:160]}" if row.status != "ok" and row.message else ""
        self._line(f"[{self.counts.done}/{self.total}] case {row.case_index} {plain(row.label())} "
                   f"{row.status} {_latency(row)} ({slot}){reason}")
        self._maybe_summary()

    def _maybe_summary(self) -> None:
        if time.monotonic() - self._last_summary >= self.summary_every_s:
            self._last_summary = time.monotonic()
            self._line(f"progress: {self.counts.done}/{self.total} done ({self.counts.text()}), "
                       f"{self.counts.rate():.2f} cases/s")

    def note(self, text: str) -> None:
        self._line(plain(text))

    def finish(self) -> None:
        self._line(f"done: {self.counts.done}/{self.total} ({self.counts.text()}), {self.counts.rate():.2f} cases/s")


class BarReporter:
    """A rich progress bar (rate, ETA) and one status line per worker; removed when the run ends."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.counts = _Counts()
        self.progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[rate]}", markup=False), TimeElapsedColumn(),
                                 TextColumn("eta"), TimeRemainingColumn(), console=console, transient=True)
        self._main: Optional[TaskID] = None
        self._slots: dict[str, TaskID] = {}

    def start(self, run_id: str, total: int, slots: list[str]) -> None:
        self.counts = _Counts()
        self.progress.start()
        self._main = self.progress.add_task(f"run {run_id}", total=total, rate="")
        for s in slots:
            self._slots[s] = self.progress.add_task(f"  {s}: starting", total=None, rate="", start=False)

    def _slot(self, slot: str, text: str) -> None:
        if slot in self._slots:
            self.progress.update(self._slots[slot], description=f"  {slot}: {text}")

    def worker_ready(self, slot: str, info: dict[str, Any]) -> None:
        self._slot(slot, f"ready ({plain((info.get('device') or {}).get('name', '?'))})")

    def case_started(self, slot: str, index: int, case: Case) -> None:
        self._slot(slot, f"[{index}] {plain(case.label())}")

    def case_done(self, slot: str, row: Row) -> None:
        self.counts.add(row)
        assert self._main is not None
        self.progress.update(self._main, advance=1, rate=f"{self.counts.rate():.1f} cases/s")
        self._slot(slot, f"idle after [{row.case_index}] {row.status}")
        if row.status == "error":
            self.progress.console.print(f"case {row.case_index} {plain(row.label())}: error "
                                        f"({row.error_kind}) {plain(row.message)[:200]}",
                                        markup=False, highlight=False)

    def note(self, text: str) -> None:
        self.progress.console.print(plain(text), markup=False, highlight=False)

    def finish(self) -> None:
        self.progress.stop()


def make_reporter(console: Optional[Console] = None) -> Any:
    """The bar on a terminal, plain lines otherwise."""
    console = console or Console(stderr=True)
    return BarReporter(console) if console.is_terminal and sys.stderr.isatty() else LogReporter(console)
