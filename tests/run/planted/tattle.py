"""A `py:` backend that tells everything its worker process holds (the secrets tests' witness).

It writes, to `$OX_TATTLE_DIR/worker-<pid>.txt`: the worker's environment, its command line and
every JobSpec object alive in the process (what the parent sent it). m=2 also prints the same to
stderr and exits, so the worker's log tail lands in that case's error row. Anything else: an
honest float GEMM.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path
from typing import Any

from operatorx.backends.py_file import gemm_inputs


def _everything() -> str:
    from operatorx.run.job import JobSpec

    jobs = [repr(o) for o in gc.get_objects() if isinstance(o, JobSpec)]
    env = "\n".join(f"{k}={v}" for k, v in sorted(os.environ.items()))
    return f"{env}\nargv={sys.argv!r}\njobs={jobs!r}\n"        # the jobs last: the end of a log is what a row keeps


def build(case: Any, device: str) -> Any:
    told = _everything()
    out = Path(os.environ["OX_TATTLE_DIR"]) / f"worker-{os.getpid()}.txt"
    with open(out, "a") as f:
        f.write(told)
    inputs = gemm_inputs(case, device)
    a, b = inputs["a"], inputs["b"]

    def call() -> Any:
        if case.args.m == 2:
            sys.stderr.write(told)
            sys.stderr.flush()
            os._exit(1)
        return a @ b.t()

    return call
