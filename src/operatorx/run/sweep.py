"""A run: plan the cases, store them as `missing`, hand them to workers, store each row as it
ends, close the run and write its document.

    testlist ─► plan (filter, limit, shard) ─► store: run + planned rows (`missing`)
             ─► scheduler ─► slots (a worker process per GPU / CPU share / Ray actor)
             ─► each final row ─► store (upsert by case key, backend, side) ─► document

An invalid testlist stops before the database is touched: nothing runs, nothing is stored. A
crash, hang or kill of a worker loses only the case it held (which is retried or stored as an
error); a kill of this process loses the cases in flight, and `--resume` runs exactly the cases
that have no final row. `run` and `ab` share this path: an A/B is a job of pairs.
"""

from __future__ import annotations

import functools
import os
import secrets
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Protocol

from operatorx.run.config import RunConfig
from operatorx.run.job import ABJob, JobSpec
from operatorx.run.scheduler import FinishedCase, Scheduler, SlotLike, Task, make_stop_handler, most_on_one_host
from operatorx.run.worker_process import CaseOutcome
from operatorx.store.errors import StoreError
from operatorx.store.run_ids import check_run_id, document_path

if TYPE_CHECKING:
    from operatorx.result import Row
    from operatorx.spec import Case
    from operatorx.store import Store
    from operatorx.store.unstored import UnstoredRows

# The testlist, the result models and the database (SQLAlchemy) are imported where they are used,
# after a new run has spawned its workers: imported here, every worker's spawn waited for them (on
# a host where nothing is byte-compiled they take over a second).

__all__ = ["Reporter", "RunOutcome", "EmptySelection", "new_run_id", "now_utc", "check_run_id",
           "run_testlist", "run_ab_pairs", "resume_run"]

class EmptySelection(ValueError):
    """The filter, limit and shard leave no case: nothing to run, and saying so beats an empty run."""


class Reporter(Protocol):
    """What the CLI shows while a run goes on. Called from the run's own thread only."""

    def start(self, run_id: str, total: int, slots: list[str]) -> None: ...
    def worker_ready(self, slot: str, info: dict[str, Any]) -> None: ...
    def case_started(self, slot: str, index: int, case: Case) -> None: ...
    def case_done(self, slot: str, row: Row) -> None: ...
    def note(self, text: str) -> None: ...
    def finish(self) -> None: ...


class _Silent:
    def start(self, run_id: str, total: int, slots: list[str]) -> None: ...
    def worker_ready(self, slot: str, info: dict[str, Any]) -> None: ...
    def case_started(self, slot: str, index: int, case: Case) -> None: ...
    def case_done(self, slot: str, row: Row) -> None: ...
    def note(self, text: str) -> None: ...
    def finish(self) -> None: ...


@dataclass
class RunOutcome:
    run_id: str
    document_path: Path
    state: str = "finished"
    """finished, interrupted (a signal; `--resume` finishes it) or failed (no worker could run)."""
    row_docs: list[dict[str, Any]] = field(default_factory=list)
    """Every row of the run as the document holds it, in case order (`missing` for the cases that did
    not finish). The typed rows are `rows`, validated when first asked for: validating 5,000 rows
    costs about a second that the command's summary does not need."""
    unstored: int = 0
    """Rows the database refused after its retries; the document holds them (or, when no document
    could be written, the rows file `saved` names)."""
    document_written: bool = True
    """False when no location could take the document (a full disk): `saved` says where the rows are."""
    saved: Optional[str] = None
    """One line saying where the document or the rows the database refused went, when anything did
    not go where it should (a full disk, a failing store); None when everything did."""

    @functools.cached_property
    def rows(self) -> list[Row]:
        """`row_docs` as typed rows."""
        from operatorx.result import Row

        return [Row.from_json(d) for d in self.row_docs]

    def count(self, status: str) -> int:
        return sum(d["status"] == status for d in self.row_docs)


def now_utc() -> str:
    """The time stamps of runs: UTC, ISO 8601, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_run_id() -> str:
    """`YYYYmmdd-HHMMSS-` + 6 hex digits: sortable by start time, unique across machines."""
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def _device_kind(requested: Optional[str]) -> str:
    """cuda or cpu, decided without a CUDA context in this process."""
    from operatorx.run.gpus import visible_gpus

    if requested not in (None, "auto", "cuda", "cpu"):
        raise ValueError(f"--device {requested}: use cuda or cpu")
    if requested == "cpu":
        return "cpu"
    has_gpu = bool(visible_gpus())
    if requested == "cuda" and not has_gpu:
        raise RuntimeError("--device cuda: no GPU is visible (NVML finds none, or CUDA_VISIBLE_DEVICES hides them)")
    return "cuda" if has_gpu else "cpu"


def _check_backend(config: RunConfig) -> None:
    """A backend name that is not in the backend table, registered or the user's own code is an error,
    and so is one whose requirement is not installed: raised before any worker is spawned, from the
    table alone (no backend is imported)."""
    from operatorx.backends.names import entry_for

    entry = entry_for(config.backend)
    if entry is None:
        from operatorx.backends.registry import known_backend_names

        if config.backend not in known_backend_names():
            raise ValueError(f"--backend {config.backend}: no such backend (known: "
                             f"{', '.join(known_backend_names())}; or py:FILE.py:FUNC, mod:PKG.MOD:FUNC@DIR)")
        return
    missing = entry.missing()
    if missing is not None:
        raise ValueError(missing)


def _slots(spec: JobSpec) -> list[SlotLike]:
    """One slot per GPU (CUDA), per `--workers` (CPU), or one in this process (`inline`)."""
    from operatorx.run.gpus import visible_gpus, worker_env
    from operatorx.run.worker_process import Slot

    config = spec.config
    if config.executor == "inline":
        from operatorx.run.inline_slot import InlineSlot

        return [InlineSlot(spec)]
    if config.device == "cuda":
        visible = visible_gpus()
        chosen = list(config.gpus) if config.gpus is not None else list(range(len(visible)))
        bad = [g for g in chosen if g >= len(visible)]
        if bad:
            raise ValueError(f"--gpus {','.join(map(str, bad))}: only {len(visible)} GPU(s) are visible")
        entries: list[Optional[str]] = [visible[g] for g in chosen]
        share = None
    else:
        entries = [None] * config.workers
        share = max(1, (os.cpu_count() or 1) // config.workers)
    if config.executor == "ray":
        from operatorx.run.ray_slot import ray_slots

        return list(ray_slots(spec, len(entries), config.ray_address, share))
    return [Slot(spec=spec, env=worker_env(e, share), name=f"gpu{e}" if e is not None else f"cpu{i}",
                 cpu_share=share) for i, e in enumerate(entries)]


def _failure_row(spec: JobSpec, task: Task, outcome: CaseOutcome) -> Row:
    """The row of a case whose worker gave no row: it hung, died, or was stopped."""
    from operatorx.result import Row

    kind = outcome.failure or "crashed"
    first, _, tail = outcome.detail.partition("\n")
    tried = f" (tried {task.kills} times)" if task.kills > 1 else ""
    message = f"{kind}: the worker {first}{tried}" if kind == "crashed" else f"{kind}: {first}{tried}"
    metrics: dict[str, Any] = {"scheme": task.case.scheme(), "worker_stderr_tail": tail or None,
                               "failures": task.failures}
    return Row.model_validate({"case": task.case, "backend": spec.backend_label, "status": "error",
                               "testlist": spec.testlist, "case_index": task.index, "message": message,
                               "error_kind": kind, "metrics": metrics})


_FAILED_IN_A_ROW = 2
"""Single rows the store failed one after another before the rest of a group is not tried."""


class _Sink:
    """Final rows to the store (and the reporter), worker info to the run record."""

    def __init__(self, spec: JobSpec, store: Store, reporter: Reporter, kept: Optional[UnstoredRows] = None) -> None:
        if kept is None:
            from operatorx.store.unstored import UnstoredRows

            kept = UnstoredRows(spec.run_id, spec.config.results_dir, _header_from_job(spec))
        self.spec, self.store, self.reporter, self.kept = spec, store, reporter, kept
        self.unstored: dict[tuple[str, str, str], Row] = {}
        self._workers: dict[str, Any] = {}

    def _keep(self, row: Row) -> str:
        """Keep a row the store refused: for the document, and in the rows file at once, before
        anything else can fail (store/unstored.py). Where it is kept, in words."""
        self.unstored[row.key()] = row
        moved = self.kept.add(row.key(), row.to_json())
        if moved is not None:
            self.reporter.note(moved)
        return str(self.kept.path) if self.kept.path is not None else "memory only"

    def worker_ready(self, slot: str, info: dict[str, Any]) -> None:
        first = not self._workers
        self._workers[slot] = {"device": info.get("device"), "l2_check": info.get("l2_check"),
                               "startup_s": info.get("startup_s"), "clock_ramp": info.get("clock_ramp"),
                               "launch_gap": info.get("launch_gap")}
        patch: dict[str, Any] = {"workers": dict(self._workers)}
        if first:                                  # the run's provenance: where its first worker ran
            patch.update({k: v for k, v in info.items() if k != "l2_check"})
            patch["l2_check"] = info.get("l2_check")
        try:
            self.store.update_run_info(self.spec.run_id, patch)
        except StoreError as err:                  # provenance is the run's; a busy store must not end it
            self.reporter.note(f"{slot}: where it runs was not stored ({err})")
        self.reporter.worker_ready(slot, info)

    def case_started(self, slot: str, task: Task) -> None:
        self.reporter.case_started(slot, task.index, task.case)

    def cases_finished(self, finished: list[FinishedCase]) -> None:
        """Store the rows in one transaction. When that fails, each on its own, so that one row the
        store refuses does not take the others with it; but after `_FAILED_IN_A_ROW` single rows fail
        one after another the database itself is failing (locked, unreachable), and the rest are not
        tried: each try waits out the store's retries, and a stopping run must not wait that long
        per row. A row that is not stored is kept in the run's rows file and document (`_keep`)."""
        rows = [self._row(f) for f in finished]
        if len(rows) == 1 or not self._put_together(rows):
            failed_in_a_row, skipped, where = 0, 0, ""
            for row in rows:
                if failed_in_a_row >= _FAILED_IN_A_ROW:
                    where = self._keep(row)
                    skipped += 1
                else:
                    failed_in_a_row = 0 if self._put_alone(row) else failed_in_a_row + 1
            if skipped:
                self.reporter.note(f"{skipped} more row(s) not tried: the database failed {_FAILED_IN_A_ROW} "
                                   f"rows in a row; they are kept in {where}")
        for f, row in zip(finished, rows, strict=True):
            self.reporter.case_done(f.slot, row)
            if f.outcome.compile_grace_used_s > 0:     # the run's --case-timeout did not hold: say why
                moved_s = f.outcome.compile_grace_used_s
                self.reporter.note(f"{f.slot}: case {f.task.index}'s deadline moved {moved_s:.0f} s past "
                                   "--case-timeout while its worker compiled kernels (--compile-grace)")

    def _row(self, f: FinishedCase) -> Row:
        """The case's row; a row from the worker that does not validate is that case's error, not
        the end of the run (nor of the other rows stored with it)."""
        from operatorx.result import Row

        if f.outcome.row is None:
            return _failure_row(self.spec, f.task, f.outcome)
        try:
            return Row.from_json(f.outcome.row)
        except Exception as err:  # noqa: BLE001 - a malformed row (a user backend's metadata, a version skew)
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            unreadable = CaseOutcome(index=f.outcome.index, failure="exception",
                                     detail=f"the worker's row did not validate: {first}")
            return _failure_row(self.spec, f.task, unreadable)

    def _put_together(self, rows: list[Row]) -> bool:
        try:
            self.store.put_rows(self.spec.run_id, rows)
        except Exception:  # noqa: BLE001 - any refusal: each row is tried alone
            return False
        return True

    def _put_alone(self, row: Row) -> bool:
        try:
            self.store.put_row(self.spec.run_id, row)
        except Exception as err:  # noqa: BLE001 - a row the store refuses is kept, whatever the reason
            where = self._keep(row)
            self.reporter.note(f"row of case {row.case_index} not stored ({_one_line(err)}); kept in {where}")
            return False
        return True

    def slot_failed(self, slot: str, message: str) -> None:
        self.reporter.note(f"{slot}: no worker could start; its cases go to the others. {message}")


def _one_line(err: BaseException) -> str:
    """An exception as one line: a StoreError's own message, else its type and first line."""
    if isinstance(err, StoreError):
        return str(err)
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def _is_terminal(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _leave_hung_up_terminals(fds: list[int]) -> None:
    """Point those of `fds` (stdout, stderr) whose terminal has hung up at /dev/null: a write to a
    hung-up terminal fails (EIO), and a failing note or summary must not end the run before its
    document is written. A terminal that still answers (a `kill -HUP` from a live shell) is kept."""
    for fd in fds:
        if _is_terminal(fd):
            continue
        try:
            null = os.open(os.devnull, os.O_WRONLY)
        except OSError:
            continue
        os.dup2(null, fd)
        os.close(null)


@contextmanager
def _signals_stop(scheduler: Scheduler, reporter: Reporter) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP stop the run gracefully while it lasts (main thread only).

    SIGHUP is what a closed terminal or ssh session sends; it used to end the run at once, with no
    document and the run left `running`. Its terminal is gone, so output bound for it goes to
    /dev/null from then on. A SIGHUP ignored when the run began (`nohup`) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def said(signum: int) -> None:
        reporter.note(f"{signal.Signals(signum).name}: no new cases; waiting up to {scheduler.grace_s:g} s "
                      "for the cases in flight")

    stop = make_stop_handler(scheduler, said)
    terminals = [fd for fd in (1, 2) if _is_terminal(fd)]

    def handler(signum: int, frame: Any) -> None:
        if signum == signal.SIGHUP:
            _leave_hung_up_terminals(terminals)
        stop(signum, frame)

    stopping = [signal.SIGINT, signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        stopping.append(signal.SIGHUP)
    old = {s: signal.signal(s, handler) for s in stopping}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _run_header(spec: JobSpec, store: Store) -> dict[str, Any]:
    """The run's record as stored (read once, while the store works), for the header of its rows
    file; built from the job when the store cannot be read."""
    from operatorx.store.unstored import run_record

    try:
        record = run_record(store._read, spec.run_id)
    except Exception:  # noqa: BLE001 - the header then comes from the job itself
        record = None
    return record if record is not None else _header_from_job(spec)


def _header_from_job(spec: JobSpec) -> dict[str, Any]:
    """The run's record as far as the job knows it (the start time is now)."""
    config = spec.config
    return {"id": spec.run_id, "started_at": now_utc(), "testlist": spec.testlist, "backend": spec.backend_label,
            "device_kind": config.device, "run_group": config.run_group,
            "shard": None if config.shard is None else str(config.shard)}


def _execute(spec: JobSpec, store: Store, tasks: list[Task], reporter: Reporter,
             slots: Optional[list[SlotLike]] = None) -> RunOutcome:
    from operatorx.store.unstored import UnstoredRows

    config = spec.config
    kept = UnstoredRows(spec.run_id, config.results_dir, _run_header(spec, store))
    if not tasks:                                  # a resumed run that is complete: no worker to start
        finished_at = now_utc()
        stored = _store_state(store, spec.run_id, "finished", finished_at, reporter)
        return _close(spec, store, "finished", {}, kept, finished_at=finished_at, state_stored=stored)
    slots = slots if slots is not None else _slots(spec)
    if len(slots) > 1:
        from operatorx.run.plan import longest_first

        tasks = longest_first(tasks, lambda t: t.case)
    tasks, refused, gangs = _multi_rank(spec, tasks, most_on_one_host(slots))
    sink = _Sink(spec, store, reporter, kept)
    scheduler = Scheduler(slots, tasks, config.case_deadline_s(), config.grace_s, sink, gangs=gangs)
    reporter.start(spec.run_id, len(tasks) + len(refused), [s.name for s in slots])
    completed = False
    try:
        if refused:
            sink.cases_finished(refused)
        with _signals_stop(scheduler, reporter):
            scheduler.run()
        completed = True
    finally:
        state = ("interrupted" if scheduler.interrupted
                 else "failed" if scheduler.unrun or not completed else "finished")
        finished_at = now_utc()
        stored = _store_state(store, spec.run_id, state, finished_at, reporter)
        outcome = _close(spec, store, state, sink.unstored, kept, finished_at=finished_at, state_stored=stored)
        reporter.finish()
    return outcome


def _multi_rank(spec: JobSpec, tasks: list[Task], workers: int) -> tuple[list[Task], list[FinishedCase], Any]:
    """The tasks in the order the scheduler takes them (multi-rank cases first, by split), the
    multi-rank cases this run cannot give their workers (finished here, `unsupported` with why), and
    the runner of the others' gangs (None when there is none) (run/ranks/placement.py)."""
    from operatorx.run.ranks.placement import place, refused_row

    config = spec.config
    ordered, refused = place(tasks, rank_local=config.rank_local, executor=config.executor,
                             device_kind=config.device or "cpu", workers=workers, ab=spec.ab is not None)
    rows = [FinishedCase("", task, CaseOutcome(index=task.index, row=refused_row(task, why, spec.backend_label,
                                                                                  spec.testlist).to_json()))
            for task, why in refused]
    gangs = None
    if any(t.world > 1 for t in ordered):
        from operatorx.run.ranks.gang import GangRunner

        homes = None
        if config.executor == "ray":
            from operatorx.run.ranks.ray_gang import RayGangHomes

            homes = RayGangHomes()
        gangs = GangRunner(config.device or "cpu", config.case_deadline_s(), homes=homes)
    return ordered, rows, gangs


def _store_state(store: Store, run_id: str, state: str, finished_at: str, reporter: Reporter) -> bool:
    """Store the state the run ended in; False, said in one line, when the store cannot (a full
    disk, a lost server): the document or the rows file then carries it, and the run's rows must
    still reach a file, which a raise here prevented."""
    try:
        store.finish_run(run_id, finished_at, state)
    except Exception as err:  # noqa: BLE001 - whatever the store's failure, the document comes next
        reporter.note(f"the run's end ({state}) could not be stored ({_one_line(err)}); the database says "
                      "`running` until the document is ingested or the run resumed")
        return False
    return True


def _write_document(doc: dict[str, Any], path: Path, run_id: str) -> tuple[Optional[Path], str]:
    """Write `doc` to `path`, or, when that directory cannot take it (full, a file size limit), to
    a new file in the system's temporary directory. (Where it went or None, why `path` did not.)"""
    import tempfile

    from operatorx.store import write_json_atomic

    try:
        write_json_atomic(doc, path)
        return path, ""
    except OSError as err:
        why = f"{path.parent}: {err.strerror or err}"
    fallback: Optional[Path] = None
    try:
        fd, name = tempfile.mkstemp(prefix=f"operatorx-{run_id}-", suffix=".json")
        os.close(fd)
        fallback = Path(name)
        write_json_atomic(doc, fallback)
        return fallback, why
    except OSError as err:
        if fallback is not None:
            fallback.unlink(missing_ok=True)
        return None, f"{why}; {tempfile.gettempdir()}: {err.strerror or err}"


def _close(spec: JobSpec, store: Store, state: str, unstored: dict[tuple[str, str, str], Row],
           kept: Optional[UnstoredRows] = None, *, finished_at: Optional[str] = None,
           state_stored: bool = True) -> RunOutcome:
    """Write the run's document (the stored rows, with any the store refused, and the state it ended
    in) and read the rows back. A full disk or a failing store raises nothing here: the document
    goes to the results directory, else to the temporary directory, else the rows the store refused
    stay in their rows file (written as each was refused), and `saved` says which in one line."""
    from operatorx.result import Row
    from operatorx.store.unstored import UnstoredRows

    if kept is None:
        kept = UnstoredRows(spec.run_id, spec.config.results_dir, _header_from_job(spec))
    path = document_path(spec.config.results_dir, spec.run_id)
    try:
        doc: Optional[dict[str, Any]] = store.document(spec.run_id)
    except Exception as err:  # noqa: BLE001 - the rows file then holds what the store refused
        doc, why = None, f"the database could not be read back ({_one_line(err)})"
    if doc is not None:
        if unstored:
            rows = [Row.from_json(r) for r in doc["rows"]]
            doc["rows"] = [unstored.get(r.key(), r).to_json() for r in rows]
            doc["run"]["unstored_rows"] = len(unstored)
        if not state_stored:
            doc["run"].update(state=state, finished_at=finished_at)
        written, why = _write_document(doc, path, spec.run_id)
        if written is not None:
            kept.discard()                         # the document holds every row
            said = [f"{path.parent} could not take the document ({why}); it is in {written}"] if why else []
            if unstored:
                said.append(f"the {len(unstored)} row(s) the database could not store are in {written}: "
                            f"`operatorx db ingest {written}` stores them")
            return RunOutcome(run_id=spec.run_id, document_path=written, state=state, row_docs=doc["rows"],
                              unstored=len(unstored), saved="; ".join(said) or None)
    kept.close(state, finished_at)
    n = len(kept.rows)
    if kept.path is not None:
        saved = (f"no document was written ({why}); the {n} row(s) the database could not store are in "
                 f"{kept.path}: `operatorx db ingest {kept.path}` stores them")
    elif n:
        saved = (f"no document was written ({why}), and no file could take the {n} row(s) the database could "
                 f"not store ({kept.error}): they are lost")
    else:
        saved = (f"no document was written ({why}); every row of the run is in the database "
                 f"(`operatorx results export {spec.run_id}`)")
    row_docs = sorted(kept.rows.values(), key=lambda d: int(d.get("case_index") or 0))
    return RunOutcome(run_id=spec.run_id, document_path=path, state=state, row_docs=row_docs, unstored=n,
                      document_written=False, saved=saved)


def _decided(config: RunConfig) -> RunConfig:
    """The config as it will run: its device and executor decided (no CUDA context here)."""
    executor = "inline" if config.counters_child else config.executor   # ncu follows one process
    return replace(config, device=_device_kind(config.device), executor=executor)


def _chosen(config: RunConfig) -> tuple[dict[str, Any], list[tuple[int, Case]]]:
    """What the run records of its testlist, and the chosen cases."""
    from operatorx.run.plan import select_cases
    from operatorx.spec import resolve_testlist
    from operatorx.spec.testlist import read_testlist

    path = resolve_testlist(config.testlist)
    testlist = read_testlist(path)                    # raises TestlistError: nothing stored; duplicates merged
    cases = testlist.cases
    chosen = select_cases(cases, config.filter, config.limit, config.shard, indexes=testlist.indexes)
    if not chosen:
        what = [f"--filter {config.filter!r}" if config.filter else "",
                f"--shard {config.shard}" if config.shard else ""]
        why = " and ".join(w for w in what if w) or "the testlist is empty"
        raise EmptySelection(f"{path}: no case to run ({why} selects none of its {len(cases)} cases)")
    return {"testlist_path": str(path), "cases_in_testlist": len(cases),
            "duplicates_merged": testlist.duplicates}, chosen


def _spawned_ahead(spec: JobSpec) -> list[SlotLike]:
    """The run's slots, their worker processes already starting: a worker's start-up (Python, torch,
    CUDA, CUPTI, the clock ramp) then overlaps the parent's loading of the testlist and storing of
    the plan. Whoever takes them closes them, on every path."""
    slots = _slots(spec)
    for slot in slots:
        ahead = getattr(slot, "spawn_ahead", None)
        if ahead is not None:
            ahead()
    return slots


def _new_run(config: RunConfig, reporter: Reporter, ab: Optional[ABJob] = None,
             info: Optional[dict[str, Any]] = None, check_backend: bool = False) -> RunOutcome:
    """A new run: the backend's name checked, workers spawned, then the testlist loaded and the plan
    stored, then executed. A bad testlist stops the spawned workers and stores nothing."""
    config = _decided(config)
    run_id = check_run_id(config.run_id or new_run_id())
    spec = JobSpec(config=replace(config, run_id=run_id), run_id=run_id, testlist=config.testlist, ab=ab)
    if check_backend:
        _check_backend(config)
    slots = _spawned_ahead(spec) if config.executor == "local" else []    # (a Ray cluster is joined after)
    try:
        from operatorx.bulk import gc_paused
        from operatorx.store import Store

        with gc_paused():                  # load, plan and store as one bulk step (operatorx/bulk.py)
            source, chosen = _chosen(config)
            if source.get("duplicates_merged"):
                reporter.note(f"{source['duplicates_merged']:,} duplicate case(s) in the testlist merged into their "
                              "first copies: each case is measured once, with every copy's sources")
            store = Store(config.db)
            tasks = _begin(spec, store, chosen, {**source, **(info or {})})
        _remember(spec, reporter)
        used = _workers_used(tasks, config.rank_local)
        _stop(slots[used:])                # fewer cases than GPUs: the extra workers go now
        return _execute(spec, store, tasks, reporter, slots[:used] or None)
    except BaseException:
        _stop(slots)                       # a bad testlist or store, or Ctrl-C before the run began
        raise


def _workers_used(tasks: list[Task], rank_local: bool) -> int:
    """How many workers the tasks can use at once: one each, and a multi-rank case its tp·dp."""
    widest = max((t.case.world for t in tasks if not rank_local and t.case.implemented), default=1)
    return max(len(tasks), widest)


def _remember(spec: JobSpec, reporter: Reporter) -> None:
    """This machine's ledger entry for the run: what `--resume` trusts for its backend and paths."""
    from operatorx.run.resume import remember_started

    try:
        remember_started(spec)
    except OSError as err:
        reporter.note(f"this machine's record of the run was not written ({err.strerror or err}): "
                      f"`--resume {spec.run_id}` will ask for --backend")


def _stop(slots: list[SlotLike]) -> None:
    """Kill and close `slots` (whatever their workers are doing); closing twice is harmless."""
    for slot in slots:
        slot.kill()
        slot.close()


def _begin(spec: JobSpec, store: Store, chosen: list[tuple[int, Case]], info: dict[str, Any]) -> list[Task]:
    from operatorx.result import Plan

    config = spec.config
    planned = Plan(chosen, spec.backend_label, spec.testlist)     # each case `missing`, stored in chunks
    store.begin_run(spec.run_id, now_utc(), spec.testlist, spec.backend_label, config.device or "cpu",
                    {**info, "job": spec.to_json(), "cases_selected": len(chosen),
                     "filter": config.filter, "limit": config.limit, "timing": config.timing_used(config.device),
                     "device_kind": config.device, "executor": config.executor},
                    planned, run_group=config.run_group, shard=None if config.shard is None else str(config.shard))
    return [Task(index, case) for index, case in chosen]


def run_testlist(config: RunConfig, reporter: Optional[Reporter] = None) -> RunOutcome:
    """A new run of `config.testlist`."""
    return _new_run(config, reporter or _Silent(), check_backend=True)


def run_ab_pairs(config: RunConfig, a: str, b: str, settings: dict[str, Any],
                 reporter: Optional[Reporter] = None) -> RunOutcome:
    """An A/B over `config.testlist`: every case through both sides in one worker, stored as a run
    (`kind: ab`) whose rows hold the case's A/B result."""
    return _new_run(config, reporter or _Silent(), ab=ABJob(a=a, b=b, settings=settings),
                    info={"kind": "ab", "a": a, "b": b, "ab_settings": settings})


def resume_run(run: str, db: str, reporter: Optional[Reporter] = None,
               results_dir: Optional[Path] = None, backend: Optional[str] = None) -> RunOutcome:
    """Run exactly the cases of `run` that have no final row, with the run's own settings.

    The stored run is data: its backend (code) and paths come from this machine's record of the runs
    it started, or from `backend` (the command line's `--backend`), never from the database
    (run/resume.py). `results_dir` is this command's (default operatorx-results, or the directory
    this machine's run used)."""
    from operatorx.result import Row
    from operatorx.run.resume import resume_spec
    from operatorx.store import Store

    reporter = reporter or _Silent()
    store = Store(db, create=False)
    run_id = store.resolve_run(run)
    doc = store.document(run_id)
    spec = resume_spec(run_id, str(doc["run"].get("backend")), store.run_info(run_id), db=db, backend=backend,
                       results_dir=results_dir, note=reporter.note)
    spec = replace(spec, config=replace(spec.config, device=_device_kind(spec.config.device)))
    if spec.ab is None:
        _check_backend(spec.config)
    unfinished = set(store.unfinished(run_id))
    tasks = [Task(r.case_index, r.case) for r in map(Row.from_json, doc["rows"]) if r.case_index in unfinished]
    store.reopen_run(run_id)
    if not tasks:
        reporter.note(f"run {run_id}: every case already has its row")
    return _execute(spec, store, tasks, reporter)

