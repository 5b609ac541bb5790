"""`--executor ray`: one Ray actor per GPU, each owning the same worker process a local sweep uses.

Isolation therefore holds on every host: the actor enforces the case deadline on its worker and
restarts it after a crash, exactly as the local parent does. The actor itself is restarted by Ray
when its process dies (`max_restarts=-1`); the case it held ends as `crashed` and is tried again
in the fresh actor. Rows come back to the parent as each case finishes (`ray.wait`), and the
parent alone writes the store.

Each slot is pinned to one node (its actors start there, restarts included), and the slots fill
the largest nodes first: the W members of a multi-rank case's gang are slots of one node, which
hand their resources to the gang's placement group there (run/ranks/ray_gang.py).

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

__all__ = ["RaySlot", "RayNode", "ActorWhere", "ray_slots", "RAY_MISSING"]

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

    def run_rank(self, index: int, case_json: dict[str, Any], deadline_s: float,
                 rank: dict[str, Any]) -> dict[str, Any]:
        """One rank of a multi-rank case on the worker already started: never a fresh one, which
        would not be in the group its peers hold."""
        case = Case.model_validate(case_json)
        if not self.slot.send_case(index, case, rank=rank):
            return CaseOutcome(index=index, failure="crashed", worker_replaced=True,
                               detail="was gone before the case started").__dict__
        return self.slot.await_case(index, deadline_s, threading.Event()).__dict__

    def where(self) -> dict[str, Any]:
        import ray

        context = ray.get_runtime_context()
        group = context.get_placement_group_id()
        worker = self.slot.worker
        return {"node": context.get_node_id(), "placement_group": group,
                "gpu": self.slot.env.get("CUDA_VISIBLE_DEVICES"),
                "worker": worker.session_token if worker is not None else None}

    def free_port(self) -> int:
        """A free port on this node's loopback, for a group whose rank 0 this actor's worker is."""
        from operatorx.run.ranks.gang import free_port

        return free_port()

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self.slot.close()


@dataclass(frozen=True)
class RayNode:
    """A node of the cluster as the slots see it: its id, address, and how many slots it can hold."""

    node_id: str
    address: str
    capacity: int
    """GPUs (CUDA) or CPUs (one per CPU slot) of the node, from Ray's resources."""


@dataclass(frozen=True)
class ActorWhere:
    """Where an actor runs, as it says itself (Ray's runtime context)."""

    node: str
    placement_group: Optional[str]
    gpu: Optional[str]
    """Its worker's CUDA_VISIBLE_DEVICES entry on the node (None on the CPU device)."""
    worker: Optional[str]
    """Its worker process's session token (None: no worker started)."""


@dataclass(frozen=True)
class _ActorMaker:
    """How a slot's actors are made: one worker spec, one bundle of resources each."""

    remote: Any
    spec_json: dict[str, Any]
    cpu_share: Optional[int]
    gpu: bool

    def bundle(self) -> dict[str, float]:
        """One actor's resources: also one bundle of a gang's placement group."""
        return {"CPU": 1.0, **({"GPU": 1.0} if self.gpu else {})}

    def on_node(self, name: str, node: str) -> Any:
        """A slot's own actor, pinned to `node`, restarted by Ray when its process dies."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return self.remote.options(num_cpus=1, num_gpus=1 if self.gpu else 0, max_restarts=-1, max_task_retries=0,
                                   scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
                                   ).remote(self.spec_json, name, self.cpu_share)

    def in_group(self, name: str, group: Any, bundle: int) -> Any:
        """A rank's actor in bundle `bundle` of a gang's placement group; never restarted (a rank's
        new process would not be in its peers' group)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return self.remote.options(num_cpus=1, num_gpus=1 if self.gpu else 0, max_restarts=0, max_task_retries=0,
                                   scheduling_strategy=PlacementGroupSchedulingStrategy(group, bundle)
                                   ).remote(self.spec_json, name, self.cpu_share)


@dataclass
class RaySlot:
    """The parent's side of one actor; the same interface as a local `Slot`. While a gang holds the
    slot, its actor is the rank's, in the gang's placement group (`take_seat`); otherwise its own,
    on its node (made again when needed after `release`)."""

    name: str
    node: RayNode
    maker: _ActorMaker
    actor: Any = None
    worker: Optional[bool] = field(default=None, init=False)

    @property
    def host(self) -> str:
        """The node every actor of this slot runs on (a gang's members share one: run/scheduler.host_of)."""
        return self.node.node_id

    @property
    def host_room(self) -> int:
        """How many slots the node holds at once (its GPUs or CPUs): the largest gang it can seat."""
        return self.node.capacity

    def ensure_actor(self) -> None:
        """Start the slot's own actor now if it has none (its worker starts with `ensure_worker`)."""
        self._actor()

    def _actor(self) -> Any:
        if self.actor is None:
            self.actor = self.maker.on_node(self.name, self.host)
        return self.actor

    def ensure_worker(self) -> dict[str, Any]:
        import ray

        info: dict[str, Any] = ray.get(self._actor().ensure_worker.remote(), timeout=_ACTOR_MARGIN_S)
        self.worker = True
        return info

    def release(self) -> None:
        """End the slot's actor for good, so its resources are free (for a gang's placement group, or
        back from one); the next `ensure_worker` makes the slot's own actor again (`on_node`). Never
        raises: a rank's actor that died (never restarted) must not keep the slot from its own."""
        import ray

        actor, self.actor, self.worker = self.actor, None, None
        if actor is not None:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - an actor already gone holds nothing
                pass

    def take_seat(self, group: Any, bundle: int) -> None:
        """Make the slot's actor a rank's, in bundle `bundle` of a gang's placement group (after `release`)."""
        self.actor, self.worker = self.maker.in_group(self.name, group, bundle), None

    def where(self) -> ActorWhere:
        import ray

        return ActorWhere(**ray.get(self._actor().where.remote(), timeout=60))

    def free_port(self) -> int:
        import ray

        return int(ray.get(self._actor().free_port.remote(), timeout=60))

    def has_worker(self) -> bool:
        """Whether the actor lives and its worker too (False when either cannot be reached)."""
        import ray

        try:
            return self.actor is not None and bool(ray.get(self.actor.has_worker.remote(), timeout=60))
        except Exception:  # noqa: BLE001 - a dead or unreachable actor has no worker
            return False

    def run(self, index: int, case: Case, deadline_s: float, stop: threading.Event) -> CaseOutcome:
        return self._answer(self._actor().run.remote(index, case.to_json(), deadline_s), index, deadline_s, stop)

    def run_rank(self, index: int, case: Case, deadline_s: float, stop: threading.Event,
                 rank: dict[str, Any]) -> CaseOutcome:
        """One rank of a multi-rank case on the worker this slot's actor already started."""
        return self._answer(self._actor().run_rank.remote(index, case.to_json(), deadline_s, rank), index, deadline_s,
                            stop)

    def _answer(self, ref: Any, index: int, deadline_s: float, stop: threading.Event) -> CaseOutcome:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        t0 = time.monotonic()
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

        if self.actor is not None:
            ray.kill(self.actor, no_restart=False)   # Ray restarts the slot's own actor; its worker dies with it
        self.worker = None

    def close(self) -> None:
        import ray

        if self.actor is None:
            return
        try:
            ray.get(self.actor.close.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - an actor already gone has nothing to close
            pass
        ray.kill(self.actor, no_restart=True)


def _nodes(gpu: bool) -> list[RayNode]:
    """The cluster's live nodes, the largest first (by GPUs on CUDA, CPUs otherwise)."""
    import ray

    nodes = [RayNode(node_id=n["NodeID"], address=str(n.get("NodeManagerAddress", "")),
                     capacity=int(n.get("Resources", {}).get("GPU" if gpu else "CPU", 0)))
             for n in ray.nodes() if n.get("Alive")]
    return sorted(nodes, key=lambda n: -n.capacity)


def _spread(nodes: list[RayNode], count: int) -> list[RayNode]:
    """The node of each of `count` slots: the largest node filled first, then the next (so a gang of W
    slots fits on one node whenever a node has W); slots beyond the cluster's capacity wait on the
    largest node, as an actor Ray cannot place yet waits."""
    out: list[RayNode] = []
    for node in nodes:
        out.extend([node] * min(node.capacity, count - len(out)))
    return out + [nodes[0]] * (count - len(out))


def ray_slots(spec: JobSpec, count: int, address: Optional[str], cpu_share: Optional[int]) -> list[RaySlot]:
    """`count` actors (one per GPU on CUDA, one per CPU worker otherwise) on the cluster at `address`
    (None: a local Ray instance on loopback), each pinned to a node (`_spread`)."""
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
    nodes = _nodes(gpu)
    if not nodes:
        raise RuntimeError("the Ray cluster has no live node")
    maker = _ActorMaker(remote=ray.remote(_WorkerActor), spec_json=spec.worker_json(), cpu_share=cpu_share, gpu=gpu)
    slots = [RaySlot(name=f"ray{i}", node=node, maker=maker) for i, node in enumerate(_spread(nodes, count))]
    for slot in slots:
        slot.ensure_actor()                         # they start while the parent stores the plan
    return slots
