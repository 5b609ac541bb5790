"""`--executor inline`: the job runs in this process, with no isolation.

For a debugger, a profiler attached to one process, and unit tests whose backends exist only in
the test process. A hang hangs the run and a crash ends it; the sweep's other executors exist
for exactly that reason.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from operatorx.run.job import Job, JobSpec, build_job
from operatorx.run.memory_watch import MemoryWatch
from operatorx.run.worker import finish_row
from operatorx.run.worker_process import CaseOutcome
from operatorx.spec import Case

__all__ = ["InlineSlot"]


@dataclass
class InlineSlot:
    spec: JobSpec
    name: str = "inline"
    _job: Optional[Job] = field(default=None, init=False)
    _watch: Optional[MemoryWatch] = field(default=None, init=False)
    worker: Optional[Job] = field(default=None, init=False)

    def ensure_worker(self) -> dict[str, Any]:
        if self._job is None:
            self._job = build_job(JobSpec.from_json(self.spec.worker_json()))   # what a worker gets: no database
            self.worker = self._job
            self._watch = MemoryWatch.for_run(self.spec.config)
        return self._job.info

    def run(self, index: int, case: Case, deadline_s: float, stop: threading.Event) -> CaseOutcome:
        job, watch = self._job, self._watch
        assert job is not None and watch is not None
        config, t0 = self.spec.config, time.monotonic()
        row = job.run(case, index)
        row, _ = finish_row(row, watch.after_case(case.type), config.leak_limit_device_mib, config.leak_limit_host_mib)
        return CaseOutcome(index=index, row=row.to_json(), seconds=time.monotonic() - t0)

    def kill(self) -> None:
        """Nothing to kill: the case runs in this process."""

    def close(self) -> None:
        self._job = self.worker = None
