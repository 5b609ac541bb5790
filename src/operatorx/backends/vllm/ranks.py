"""The vllm backends over W ranks: vLLM's own parallel layers, sharded by vLLM as in serving.

Every rank forms vLLM's parallel state on the worker's group once (backends/vllm/env.py
`VllmEnv.for_ranks`: `tensor_parallel_size` = W, `enable_expert_parallel` when the case has ep),
then builds the layer exactly as on one device; vLLM registers only the rank's shard:
- gemm: the role's split (spec/shard.py) picks `ColumnParallelLinear` (gathered to [M, N], as the
  torch backend's tp GEMM), `RowParallelLinear` (this rank's K slice of the input, all-reduced) or
  `ReplicatedLinear`; each whole checkpoint tensor goes through its parameter's `weight_loader`;
- moe: `FusedMoE` (+ router gate, + shared MLP) under tp (each expert's intermediate sliced, the
  output all-reduced) or ep over the tp ranks (whole experts per rank, dp=1: every rank holds all
  tokens, so vLLM reduces with an all-reduce, no all-to-all); the whole layer's tensors are cut to
  the shapes vLLM registered (backends/vllm/shards.py).
Every rank ends with the whole [T, H] output, so each checks it against the unsplit fp32 reference
of the same inputs; rank 0's verdict is every rank's. What is not built is refused with its name:
dp > 1 (each dp rank's own batch, the dp metadata in vLLM's forward context, its all2all manager),
packed or padded expert formats (MXFP4, INT4) over several ranks, the vocab-parallel `lm_head`.
"""

from __future__ import annotations

from typing import Any, Optional

from operatorx.backends.base import Check, Prepared
from operatorx.backends.ranked import RankComm, RankPrepared
from operatorx.spec import Case
from operatorx.spec.moe import MoeArgs

__all__ = ["RANK_MOE_SCHEMES", "gemm_rank_refusal", "moe_rank_refusal", "rank_setup", "linear_split",
           "ranked"]

RANK_MOE_SCHEMES = ("bf16", "fp8_tensor_static", "fp8_token_tensor", "fp8_token_channel", "fp8_block")
"""Expert formats whose whole-layer tensors are cut by shape alone (packed or padded ones are not)."""


def linear_split(case: Case) -> tuple[str, str]:
    """(column | row | replicated, the rule): the torch backend's rule (spec/shard.py); one rank
    without sources runs the whole GEMM. ShardRefused as there."""
    from operatorx.backends.torch.tp import gemm_split

    if case.world == 1 and not case.sources:
        return "replicated", "one rank, no role named: the whole GEMM"
    return gemm_split(case)


def gemm_rank_refusal(case: Case, world: int) -> Optional[str]:
    from operatorx.spec.shard import ShardRefused

    try:
        linear_split(case)
    except ShardRefused as err:
        return str(err)
    return None


def moe_rank_refusal(case: Case, scheme: Optional[str], world: int) -> Optional[str]:
    par = case.args.parallel if isinstance(case.args, MoeArgs) else None
    dp = par.dp if par is not None else 1
    if dp > 1:
        return (f"dp={dp}: vLLM's data-parallel MoE (each dp rank's own batch, the dp metadata in its forward "
                "context, its all2all manager) is not built here; tp and ep over the tp ranks are")
    if world > 1 and scheme is not None and scheme not in RANK_MOE_SCHEMES:
        return (f"{scheme} experts over {world} ranks: their packed or padded layout is not cut into rank shards "
                f"here (built: {', '.join(RANK_MOE_SCHEMES)})")
    return None


def rank_setup(case: Case, comm: RankComm) -> Any:
    """This rank's vLLM parallel state (dp=1: tp = world; ep when the case has it)."""
    from operatorx.backends.vllm.env import RankSetup

    par = getattr(case.args, "parallel", None)
    ep = par is not None and par.ep > 1
    return RankSetup(world=comm.world, rank=comm.rank, tp=comm.world, expert_parallel=ep)


def _agreed(check: Any, comm: RankComm) -> Any:
    """Rank 0's verdict on every rank (each computed the same one on the same combined output)."""
    def one() -> Check:
        mine = check()
        agreed = comm.broadcast_object(mine, src=0)
        if not isinstance(agreed, Check):
            raise RuntimeError("rank 0 sent no check result")
        return agreed
    return one


def ranked(prepared: Prepared, case: Case, comm: RankComm, collectives: list[str]) -> RankPrepared:
    """A rank's prepared part: the layer's call, the check agreed across ranks, the whole group's rates."""
    import dataclasses

    agreed = dataclasses.replace(prepared, check=_agreed(prepared.check, comm))
    min_bytes = prepared.min_bytes if prepared.min_bytes is not None else case.min_bytes()
    return RankPrepared(agreed, flops=case.flops(), min_bytes=min_bytes, collectives=collectives)


def gemm_collectives(kind: str, world: int) -> list[str]:
    if world == 1 or kind == "replicated":
        return []
    return ["tensor_model_parallel_all_gather (vLLM, nccl)" if kind == "column"
            else "tensor_model_parallel_all_reduce (vLLM's TP group: custom all-reduce or pynccl)"]


def moe_collectives(world: int) -> list[str]:
    return [] if world == 1 else ["tensor_model_parallel_all_reduce (vLLM's TP group: custom all-reduce or pynccl)"]
