"""`--executor ray`: one Ray actor per GPU, each owning the same worker process a local sweep uses.

Isolation therefore holds on every host: the actor enforces the case deadline on its worker and
restarts it after a crash, exactly as the local parent does. The actor itself is restarted by Ray
when its process dies (`max_restarts=-1`); the case it held ends as `crashed` and is tried again
in the fresh actor. Rows come back to the parent as each case finishes (`ray.wait`), and the
parent alone writes the store.

Ray is an optional extra: `pip install "operatorx[ray]"`.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from operatorx.run.job import JobSpec
from operatorx.run.worker_process import CaseOutcome, Slot
from operatorx.spec import Case

__all__ = ["RaySlot", "ray_slots", "RAY_MISSING"]

RAY_MISSING = 'the ray executor needs Ray: pip install "operatorx[ray]"'
#: Beyond the case deadline, how long the parent waits for an actor's answer (start of a fresh
#: worker, transfer) before it kills the actor.
_ACTOR_MARGIN_S = 360.0


class _WorkerActor:
    """Lives in a Ray worker process; owns one `Slot` (and so one isolated worker process)."""

    def __init__(self, spec_json: dict[str, Any], name: str, cpu_share: Optional[int]) -> None:
        from operatorx.run.gpus import worker_env

        gpu_ids = os.environ.get("CUDA_VISIBLE_DEVICES")      # Ray sets it for num_gpus=1
        spec = JobSpec.from_json(spec_json)
        entry = gpu_ids if spec.config.device == "cuda" and gpu_ids else None
        self.slot = Slot(spec=spec, env=worker_env(entry, cpu_share), name=name, cpu_share=cpu_share)

    def ensure_worker(self) -> dict[str, Any]:
        return self.slot.ensure_worker()

    def has_worker(self) -> bool:
        return self.slot.worker is not None and self.slot.worker.alive()

    def run(self, index: int, case_json: dict[str, Any], deadline_s: float) -> dict[str, Any]:
        outcome = self.slot.run(index, Case.model_validate(case_json), deadline_s, threading.Event())
        return outcome.__dict__

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self.slot.close()


@dataclass
class RaySlot:
    """The parent's side of one actor; the same interface as a local `Slot`."""

    actor: Any
    name: str
    worker: Optional[bool] = field(default=None, init=False)

    def ensure_worker(self) -> dict[str, Any]:
        import ray

        info: dict[str, Any] = ray.get(self.actor.ensure_worker.remote(), timeout=_ACTOR_MARGIN_S)
        self.worker = True
        return info

    def run(self, index: int, case: Case, deadline_s: float, stop: threading.Event) -> CaseOutcome:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        t0 = time.monotonic()
        ref = self.actor.run.remote(index, case.to_json(), deadline_s)
        limit = t0 + deadline_s + _ACTOR_MARGIN_S
        while True:
            ready, _ = ray.wait([ref], timeout=0.25)
            if ready:
                break
            if time.monotonic() > limit:
                return self._lost(index, "timeout", t0, f"the actor gave no answer within {deadline_s:.0f} s "
                                                        "plus its margin")
        try:
            data = ray.get(ref, timeout=30)
        except (RayActorError, GetTimeoutError) as err:
            self.worker = None                     # after a stop signal: killed when its grace ran out
            return CaseOutcome(index=index, failure="interrupted" if stop.is_set() else "crashed",
                               worker_replaced=True, seconds=time.monotonic() - t0,
                               detail=f"the Ray actor died: {type(err).__name__}: {str(err).splitlines()[0]}")
        outcome = CaseOutcome(**data)
        if outcome.worker_replaced:
            self.worker = None
        return outcome

    def _lost(self, index: int, failure: str, t0: float, why: str) -> CaseOutcome:
        self.kill()
        return CaseOutcome(index=index, failure=failure, detail=why, worker_replaced=True,
                           seconds=time.monotonic() - t0)

    def kill(self) -> None:
        import ray

        ray.kill(self.actor, no_restart=False)       # Ray restarts it; its worker dies with it
        self.worker = None

    def close(self) -> None:
        import ray

        try:
            ray.get(self.actor.close.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - an actor already gone has nothing to close
            pass
        ray.kill(self.actor, no_restart=True)


def ray_slots(spec: JobSpec, count: int, address: Optional[str], cpu_share: Optional[int]) -> list[RaySlot]:
    """`count` actors (one per GPU on CUDA, one per CPU worker otherwise) on the cluster at `address`
    (None: a local Ray instance on loopback)."""
    try:
        import ray
    except ImportError as err:
        raise RuntimeError(RAY_MISSING) from err
    if not ray.is_initialized():
        if address:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False)
    gpu = spec.config.device == "cuda"
    remote = ray.remote(num_gpus=1 if gpu else 0, num_cpus=1, max_restarts=-1, max_task_retries=0)(_WorkerActor)
    return [RaySlot(actor=remote.remote(spec.worker_json(), f"ray{i}", cpu_share), name=f"ray{i}")
            for i in range(count)]
