"""A multi-rank case's gang under `--executor ray`: W fresh actors in one placement group on one node.

The gang's members are W slots pinned to one node (the scheduler gathers a gang on one host). When
its group forms, the members end their own actors, so their resources are free on that node, and
one STRICT_PACK placement group of W bundles (each a slot's resources) is made there; the W ranks'
actors start in its bundles, rank r in bundle r, and never restart. Rendezvous is on the node's
loopback, on a port rank 0's actor picks there: the parent may be on another machine. Each rank's
actor says where it runs, and a rank on another node or outside the group fails the case.

When the gang dissolves, the group is removed with its actors, and each member makes its own
actor again when it next runs a case: a process that was in one group never joins another, as with
local workers (run/ranks/gang.py). A rank's actor that dies (it is never restarted) ends its case
as that rank's failure, or, found dead before the group's next case, makes the gang's runner dissolve
the group and seat the ranks again: fresh actors in a new placement group.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from operatorx.result_ranks import PlacementGroup
from operatorx.run.worker_process import CaseOutcome

if TYPE_CHECKING:
    from operatorx.run.ray_slot import RayNode, RaySlot
    from operatorx.spec import Case

__all__ = ["RayRank", "RayGangHomes", "PLACEMENT_TIMEOUT_S", "STRATEGY"]

STRATEGY = "STRICT_PACK"
PLACEMENT_TIMEOUT_S = 300.0
"""How long a gang's placement group may take to be placed: its members just freed what it needs
on their node, so only a slow release (an actor that takes long to die) or another job using the
node delays it."""


@dataclass
class _RankProcess:
    """What the gang sees of a rank's worker: its key (session token) and whether it still lives."""

    session_token: str
    slot: RaySlot

    def alive(self) -> bool:
        return self.slot.has_worker()


@dataclass
class RayRank:
    """One rank of a gang (run/ranks/gang.GangSlot): a member slot whose actor sits in the gang's group."""

    slot: RaySlot
    placement_group: str
    node: str
    env: dict[str, str] = field(default_factory=dict)
    worker: Optional[_RankProcess] = None
    _sent: Optional[tuple[int, Case, dict[str, Any]]] = None
    name: str = field(init=False)
    """The member slot's name: the row's per-rank `worker`."""

    def __post_init__(self) -> None:
        self.name = self.slot.name

    def ensure_worker(self) -> dict[str, Any]:
        """The rank's worker started in its actor; raises when the actor is not where the gang put it."""
        info = self.slot.ensure_worker()
        where = self.slot.where()
        if where.node != self.node or where.placement_group != self.placement_group or where.worker is None:
            raise RuntimeError(f"its actor runs on node {where.node} in placement group {where.placement_group}, "
                               f"not the gang's ({self.placement_group} on node {self.node})")
        self.env = {"CUDA_VISIBLE_DEVICES": where.gpu} if where.gpu else {}
        self.worker = _RankProcess(where.worker, self.slot)
        return info

    def send_case(self, index: int, case: Case, ahead: bool = False, rank: Optional[dict[str, Any]] = None) -> bool:
        """Kept until `await_case`, which hands case and rank to the actor in one call."""
        if self.worker is None or rank is None or ahead:
            return False
        self._sent = (index, case, rank)
        return True

    def await_case(self, index: int, deadline_s: float, stop: threading.Event) -> CaseOutcome:
        sent, self._sent = self._sent, None
        if sent is None or sent[0] != index:
            return CaseOutcome(index=index, failure="crashed", worker_replaced=True,
                               detail="was gone before the case started")
        outcome = self.slot.run_rank(index, sent[1], deadline_s, stop, sent[2])
        if outcome.worker_replaced:
            self.worker = None
        return outcome

    def kill(self) -> None:
        self.slot.kill()              # a rank's actor is never restarted: the gang is dissolved after
        self.worker = None


def _placement_group(bundles: list[dict[str, float]], node: RayNode) -> Any:
    """A STRICT_PACK group of `bundles` held to `node`: by its node-id label where this Ray has
    label selectors, else by the node's own `node:ADDRESS` resource."""
    import inspect

    from ray.util import placement_group

    if "bundle_label_selector" in inspect.signature(placement_group).parameters:
        return placement_group(bundles, strategy=STRATEGY,
                               bundle_label_selector=[{"ray.io/node-id": node.node_id}] * len(bundles))
    pinned = [{**b, f"node:{node.address}": 0.001} for b in bundles]
    return placement_group(pinned, strategy=STRATEGY)


class RayGangHomes:
    """Seats each gang's ranks in a placement group of their own (run/ranks/gang.GangHomes)."""

    def __init__(self, timeout_s: float = PLACEMENT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._groups: dict[tuple[str, ...], Any] = {}
        self._lock = threading.Lock()

    def seat(self, members: Sequence[Any]) -> Sequence[RayRank]:
        import ray
        from ray.exceptions import GetTimeoutError
        from ray.util import remove_placement_group

        slots: list[RaySlot] = list(members)
        nodes = {s.host for s in slots}
        if len(nodes) != 1:                   # the scheduler gathers a gang on one host: never expected
            raise RuntimeError(f"its slots are on {len(nodes)} nodes, not one")
        node = slots[0].node
        for s in slots:
            s.release()                       # their resources, free on the node, are the group's bundles
        group = _placement_group([s.maker.bundle() for s in slots], node)
        with self._lock:
            self._groups[tuple(s.name for s in slots)] = group
        try:
            ray.get(group.ready(), timeout=self.timeout_s)
        except GetTimeoutError:
            raise RuntimeError(f"Ray did not place a {STRATEGY} group of {len(slots)} x {slots[0].maker.bundle()} on "
                               f"node {node.node_id} within {self.timeout_s:.0f} s") from None
        except Exception:
            with self._lock:
                self._groups.pop(tuple(s.name for s in slots), None)
            remove_placement_group(group)
            raise
        for r, s in enumerate(slots):
            s.take_seat(group, r)
        return [RayRank(s, placement_group=group.id.hex(), node=node.node_id) for s in slots]

    def port(self, ranks: Sequence[Any]) -> int:
        """Picked by rank 0's actor, on the ranks' node."""
        rank0: RayRank = ranks[0]
        return rank0.slot.free_port()

    def placement_group(self, ranks: Sequence[Any]) -> Optional[PlacementGroup]:
        rank0: RayRank = ranks[0]
        return PlacementGroup(scheduler="ray", id=rank0.placement_group, strategy=STRATEGY, node=rank0.node)

    def unseat(self, members: Sequence[Any]) -> None:
        from ray.util import remove_placement_group

        slots: list[RaySlot] = list(members)
        for s in slots:
            s.release()                       # a rank's actor that died as well: each member gets its own back
        with self._lock:
            group = self._groups.pop(tuple(s.name for s in slots), None)
        if group is not None:
            remove_placement_group(group)     # its bundles go back to the node, for the members' own actors
