"""The row part of a multi-rank case (`Row.ranks`, `metrics.ranks`): how its W ranks were timed.

A case with `parallel` tp·dp = W > 1 runs as W worker processes in one torch.distributed group
(docs/scaling.md, "Cases split over several GPUs"). Its `latency_us` is the median over timed
iterations of the slowest rank's time; this part holds the rest of what the ranks saw. Each
field's description feeds docs/metrics.md.
"""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from operatorx.result_parts import Part, Telemetry, doc

__all__ = ["RankLine", "Ranks", "PlacementGroup", "NO_KERNELS_CPU", "NO_KERNELS_EVENTS", "KERNELS_RECORDED"]

NO_KERNELS_CPU = "none: the CPU device runs no kernels, so no rank has a busy or collective time"
NO_KERNELS_EVENTS = ("not recorded: --timing events reads a CUDA event pair around each call, with the activity "
                     "records off")
KERNELS_RECORDED = ("recorded: each rank's own kernel records; an iteration's time is its call's kernel span, busy "
                    "the time some kernel ran, collective the time NCCL kernels ran")


class RankLine(Part):
    """One rank of a multi-rank row (`ranks.per_rank[]`)."""

    rank: int = doc("the rank in the case's group (0 .. world-1)", "", ...)
    gpu: Optional[str] = doc("the GPU the rank ran on (its CUDA_VISIBLE_DEVICES entry on the host); null on the "
                             "CPU device")
    worker: Optional[str] = doc("the sweep's worker (slot) that ran the rank, e.g. `gpu3` or `cpu1`")
    latency_us: float = doc("median of this rank's own per-iteration times (each after the barrier): on CUDA the "
                            "call's kernel span, as a single-rank row's, or its event pair under --timing events",
                            "µs", ...)
    samples_us: list[float] = Field(default_factory=list, description="this rank's time of every timed iteration, "
                                    "in order: the row's `samples_us` is their maximum over the ranks, iteration by "
                                    "iteration", json_schema_extra={"unit": "µs"})
    busy_us: Optional[float] = doc("median time some kernel of this rank's call was running (a collective's "
                                   "kernel waiting for a peer runs, so it counts); null where no kernel time is "
                                   "recorded (`ranks.kernel_times` says why: the CPU device, --timing events)", "µs")
    collective_us: Optional[float] = doc("median time the collectives' kernels (NCCL's) of this rank's call ran, "
                                         "waits for peers included; 0 where the call holds none; null where no "
                                         "kernel time is recorded (`ranks.kernel_times`)", "µs")
    capped: Optional[bool] = doc("this rank's GPU was under a power or thermal cap in the kept attempt")
    telemetry: Optional[Telemetry] = doc("this rank's GPU clocks, power and temperature while it was timed")


class PlacementGroup(Part):
    """Where a cluster scheduler put the group's W processes together (`ranks.placement_group`)."""

    scheduler: str = doc("what placed them: `ray`", "", ...)
    id: str = doc("the Ray placement group the W rank actors ran in, one bundle per rank (hex id)", "", ...)
    strategy: str = doc("the placement group's strategy: `STRICT_PACK`, every bundle on one node", "", ...)
    node: str = doc("the Ray node every rank's actor ran on (each actor said so itself)", "", ...)


class Ranks(Part):
    """A case run over W ranks of one host as one group: every iteration starts behind a barrier, and
    per iteration the slowest and fastest ranks' times are kept (measure/rank_timing.py)."""

    world: int = doc("ranks the case ran over: tp·dp", "ranks", ...)
    split: str = doc("the case's split, e.g. `tp2`, `dp2·ep2`", "", ...)
    latency_us_min: float = doc("median over the timed iterations of the fastest rank's time (`latency_us` is the "
                                "median of the slowest's)", "µs", ...)
    skew_us: float = doc("median over the timed iterations of the spread between the slowest and the fastest "
                         "rank (max − min): how unevenly the ranks finish after starting together", "µs", ...)
    iterations: int = doc("timed iterations; every rank ran each one (the count is agreed across ranks)", "calls", ...)
    starved_iterations_dropped: int = doc("timed iterations dropped on every rank because some rank's GPU sat idle "
                                          "before or inside its call (that host launched late; a late rank also "
                                          "holds its peers in their collectives), beside `iterations`", "calls", 0)
    host_gaps_included: bool = doc("every iteration of three rounds in a row was starved on some rank: the op itself "
                                   "leaves the GPU idle inside its call, so its starved iterations are kept "
                                   "(`starved_iterations_kept`) and its spans include that host time", "", False)
    starved_iterations_kept: int = doc("starved iterations kept once `host_gaps_included`", "calls", 0)
    capped_ranks: list[int] = Field(default_factory=list, description="ranks whose GPU was capped in the kept "
                                    "attempt (a capped rank makes every rank take the attempt again)",
                                    json_schema_extra={"unit": ""})
    barrier: Optional[str] = doc("what each timed iteration waited on before its call: `gloo all_reduce of one "
                                 "element` (CPU) or `device all_reduce of one element, no host sync` (CUDA)")
    kernel_times: Optional[str] = doc("whether the per-rank busy and collective times were recorded, and why not "
                                      "when they are null")
    collectives: Optional[list[str]] = doc("the collectives inside the timed call, with the process group's backend "
                                           "(`all_gather_single (gloo)`, `all_to_all_single (nccl)`)")
    per_rank: list[RankLine] = Field(default_factory=list, description="one line per rank, in rank order",
                                     json_schema_extra={"unit": ""})
    placement_group: Optional[PlacementGroup] = doc("where a cluster scheduler put the W ranks together "
                                                    "(--executor ray: one placement group on one node); null for a "
                                                    "host's own workers")
