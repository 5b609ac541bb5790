"""A sweep worker: one long-lived process per GPU (or per CPU share), started by the parent with
`python -m operatorx.run.worker`, CUDA_VISIBLE_DEVICES already set, in its own process group.

It builds the job once (CUDA context, timer, L2 probe), then reads cases from stdin and answers
each with its row. After every case it checks that the case gave its memory back; a case that
did not, or one that poisoned the CUDA context, is its last: the row says so and the worker
exits, and the parent starts a fresh one. Anything worse (a hang, a segfault, `os._exit`) the
parent sees from outside and handles the same way.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import threading
import traceback
from typing import IO, Any

from operatorx.result import Row
from operatorx.run.faults import classify_message, poisons_worker
from operatorx.run.job import Job, JobSpec, build_job
from operatorx.run.memory_watch import MemoryDelta, MemoryWatch
from operatorx.run.protocol import STACKS_SIGNAL, parse, send
from operatorx.run.session import become_subreaper, kill_own_descendants
from operatorx.spec import Case

__all__ = ["main", "finish_row", "with_changes"]


def with_changes(row: Row, **changes: Any) -> Row:
    """A copy of `row` with fields replaced (status, message, error_kind, memory), validated again:
    rows are immutable and typed. The parts left as they are, already typed, are taken as they are;
    the row's document round trip did the same in 0.1-0.3 ms a case, in the worker between two cases."""
    return Row.model_validate({**{name: getattr(row, name) for name in row.model_fields_set}, **changes})


def finish_row(row: Row, delta: MemoryDelta, device_limit_mib: float, host_limit_mib: float) -> tuple[Row, bool]:
    """The row with its error kind and memory reading, and whether the worker must be replaced."""
    kind = getattr(row, "error_kind", None)
    if row.status == "error" and kind is None:
        kind = classify_message(row.message, wrong_result=(row.message or "").startswith("wrong result"))
    status, message = row.status, row.message
    leak = delta.leak(device_limit_mib, host_limit_mib)
    if leak is not None and kind is None:
        status, kind, message = "error", "leak", leak
    elif leak is not None:
        message = f"{message}; {leak}"
    return with_changes(row, status=status, message=message, error_kind=kind, memory=delta.to_json()), \
        poisons_worker(kind) or leak is not None


def _die_with_parent() -> None:
    """Linux: the kernel kills this worker when the parent dies (kill -9 included), so no worker
    outlives its sweep holding a GPU."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _open_cuda_early() -> threading.Thread:
    """Start CUDA's driver and this GPU's primary context in a thread, while the main thread
    imports torch: ctypes releases the GIL, so the two overlap, and torch's runtime later finds
    the context already made (the runtime API uses the primary context). On failure the thread
    just ends: torch then starts CUDA itself and reports what is wrong, as without it."""

    # torch sets this before its own first CUDA call, and the driver reads it when CUDA starts: set
    # it as torch would, or a driver without lazy loading by default would load every kernel now
    os.environ.setdefault("CUDA_MODULE_LOADING", "LAZY")

    def retain() -> None:
        try:
            driver = ctypes.CDLL("libcuda.so.1")
            device, context = ctypes.c_int(0), ctypes.c_void_p()
            if driver.cuInit(0) == 0 and driver.cuDeviceGet(ctypes.byref(device), 0) == 0:
                driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)   # kept for the process's life
        except (OSError, AttributeError):
            pass

    thread = threading.Thread(target=retain, name="ox-cuda-start", daemon=True)
    thread.start()
    return thread


def _serve(job: Job, spec: JobSpec, channel: IO[str]) -> None:
    config = spec.config
    watch = MemoryWatch.for_run(config)
    for line in sys.stdin:
        msg = parse(line)
        if msg is None or msg.kind == "stop":
            return
        case = Case.model_validate(msg.body["case"])
        index = int(msg.body["index"])
        send(channel, "started", index=index)
        if msg.body.get("rank") is not None:      # one rank of a multi-rank case (run/ranks/)
            from operatorx.run.ranks.worker_side import serve_rank_case

            if serve_rank_case(job, case, index, msg.body, channel, watch, config.leak_limit_device_mib,
                               config.leak_limit_host_mib):
                return
            continue
        row = job.run(case, index)
        row, replace = finish_row(row, watch.after_case(case.type), config.leak_limit_device_mib,
                                  config.leak_limit_host_mib)
        send(channel, "row", index=index, row=row.to_json(), replace=replace)
        if replace:
            return


def main() -> int:
    channel = os.fdopen(os.dup(1), "w", buffering=1)     # the protocol keeps the real stdout...
    os.dup2(2, 1)                                         # ...and anything printed goes to the log
    sys.stdout = sys.stderr
    _die_with_parent()
    faulthandler.register(STACKS_SIGNAL, all_threads=True)   # where a hung case waits, on the parent's ask
    become_subreaper()          # what a backend starts stays in this process's tree (run/session.py)
    signal.signal(signal.SIGINT, signal.SIG_IGN)          # the parent decides when a case stops
    first = parse(sys.stdin.readline())
    if first is None or first.kind != "init":
        return 2
    try:
        spec = JobSpec.from_json(first.body["job"])
        if spec.config.device == "cuda" and not spec.config.counters_child:
            _open_cuda_early()
        job = build_job(spec, cpu_share=first.body.get("cpu_share"))
    except Exception as err:  # noqa: BLE001 - the parent gets the reason in one line; the log has the rest
        traceback.print_exc()
        send(channel, "failed", message=f"{type(err).__name__}: {str(err).strip()[:500]}")
        return 1
    send(channel, "ready", info=job.info, pid=os.getpid())
    _serve(job, spec, channel)
    channel.flush()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    kill_own_descendants()      # nothing a backend started outlives its worker (run/session.py)
    os._exit(code)      # no interpreter teardown: a poisoned CUDA context can hang it
