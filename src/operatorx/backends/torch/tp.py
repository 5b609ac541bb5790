"""The torch GEMM over tp ranks: one rank's share of the whole layer, its collective inside the call.

How the layer splits is the role's (spec/shard.py, as vLLM builds it):
- column-parallel (`qkv_proj`, `gate_up_proj`, ...): each rank holds N/T rows of the weight (and of
  the bias), computes its [M, N/T] slice, and the slices are all-gathered into the [M, N] output
  (ColumnParallelLinear with gather_output);
- row-parallel (`o_proj`, `down_proj`, ...): each rank holds K/T columns of the input and weight,
  computes an [M, N] partial sum, and the partials are all-reduced; rank 0 adds the bias
  (RowParallelLinear's rule: the bias once, before the reduction);
- replicated (the router `gate`, the low-rank `*_a` projections): every rank runs the whole GEMM.
Every rank makes the whole layer's inputs from the case's seed exactly as the single-device
backend does (`float_inputs`) and keeps its share, so rank 0 checks the combined output against
the unsplit fp32 reference of the very same inputs.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

from operatorx.backends.base import Check, Prepared
from operatorx.backends.check import CHECK_ROWS, REL_ERROR_BOUND, rel_error
from operatorx.backends.ranked import RankComm, RankPrepared, gather_function
from operatorx.backends.torch.gemm import _TF32_BOUND, _reference, float_inputs
from operatorx.backends.torch.memory import require_memory
from operatorx.backends.torch.quant import torch_dtype
from operatorx.catalog.gemm_split import CATALOG_SHAPES
from operatorx.spec import Case, GemmArgs
from operatorx.spec.dtypes import FLOAT_DTYPES
from operatorx.spec.shard import GemmSplit, ShardRefused, split_of_role

__all__ = ["gemm_rank_refusal", "prepare_gemm_ranks", "gemm_split"]


def gemm_split(case: Case) -> tuple[GemmSplit, str]:
    """(how the case's role splits under tp, the rule as spec/shard.py words it); ShardRefused when
    the sources do not say, or say a split this version cannot run over ranks."""
    args = case.args
    assert isinstance(args, GemmArgs)
    shard, rule = args.rank_shard(case.sources, CATALOG_SHAPES)  # refuses: no sources, unknown role, disagreement
    kind = split_of_role(case.sources[0].rpartition("/")[2])
    assert kind is not None                                       # rank_shard refused unknown roles
    if kind == "vocab":
        raise ShardRefused("vocab-parallel (lm_head, vocab padded to 64): its multi-rank GEMM is not built yet")
    tp = case.world
    even = {"column": (args.n // tp, args.k), "row": (args.n, args.k // tp), "replicated": (args.n, args.k)}[kind]
    if (kind == "column" and args.n % tp) or (kind == "row" and args.k % tp) or (shard.n, shard.k) != even:
        raise ShardRefused(f"{rule}: each rank's share is not 1/{tp} of the layer (replicated heads, uneven "
                           "splits): a multi-rank GEMM of such a layer is not built yet")
    return kind, rule


def gemm_rank_refusal(case: Case, device: str, world: int) -> Optional[str]:
    """Why the torch backend cannot run this GEMM over `world` ranks (None: it can)."""
    args = case.args
    assert isinstance(args, GemmArgs)
    if args.a.dtype not in FLOAT_DTYPES or args.b.dtype not in FLOAT_DTYPES:
        return (f"a={args.a.dtype} b={args.b.dtype}: the torch backend's multi-rank GEMM runs float operands "
                "(bf16, fp16, fp32); its fp8 tp path is not built yet")
    try:
        gemm_split(case)
    except ShardRefused as err:
        return str(err)
    return None


def prepare_gemm_ranks(case: Case, device: str, comm: RankComm) -> RankPrepared:
    """This rank's share of the GEMM and the call that computes it with its collective."""
    args = case.args
    assert isinstance(args, GemmArgs)
    kind, rule = gemm_split(case)
    rank, world = comm.rank, comm.world
    m, n, k = args.m, args.n, args.k
    item = torch_dtype(args.a.dtype).itemsize
    require_memory((m * k + n * k + 2 * m * n) * item + min(m, CHECK_ROWS) * (n + k) * 4 + (1 << 26), device)
    gen = torch.Generator(device=device).manual_seed(case.seed())
    full = float_inputs(args, device, gen)          # the whole layer's inputs, as the single-device backend makes them
    group = comm.device_group
    state: dict[str, Any] = {}
    if world == 1:                                    # one rank holds the whole layer: no collective (vLLM's tp=1)
        kind = "replicated"
    if kind == "column":
        part = n // world
        lo, hi = rank * part, (rank + 1) * part
        state["a"] = full["a"]
        state["b"] = full["b"][lo:hi].clone()
        state["bias"] = full["bias"][lo:hi].clone() if full["bias"] is not None else None
        state["out"] = torch.empty(world * m, part, device=device, dtype=full["a"].dtype)
        gather, gather_name = gather_function()
        collectives = [f"{gather_name} ({comm.backend_name})"]

        def fn() -> torch.Tensor:
            y = F.linear(state["a"], state["b"], state["bias"])
            gather(state["out"], y, group=group)
            return state["out"].view(world, m, part).permute(1, 0, 2).reshape(m, n)
        share = f"n {lo}:{hi} of {n}"
    elif kind == "row":
        part = k // world
        lo, hi = rank * part, (rank + 1) * part
        state["a"] = full["a"][:, lo:hi].contiguous()
        state["b"] = full["b"][:, lo:hi].contiguous()
        state["bias"] = full["bias"] if rank == 0 else None      # the bias once, before the reduction
        collectives = [f"all_reduce ({comm.backend_name})"]

        def fn() -> torch.Tensor:
            y = F.linear(state["a"], state["b"], state["bias"])
            dist.all_reduce(y, group=group)
            return y
        share = f"k {lo}:{hi} of {k}"
    else:
        state.update(a=full["a"], b=full["b"], bias=full["bias"])
        collectives = []

        def fn() -> torch.Tensor:
            return F.linear(state["a"], state["b"], state["bias"])
        share = "the whole GEMM"
    if rank == 0:
        state["full"] = full                          # the check's reference inputs (rank 0 only)
    else:
        del full
    tf32 = args.a.dtype == "fp32" and device == "cuda" and torch.backends.cuda.matmul.allow_tf32
    bound = _TF32_BOUND if tf32 else REL_ERROR_BOUND[args.out]

    def check() -> Check:
        out = fn()                                    # collective: every rank makes the call
        result: Optional[Check] = None
        if rank == 0:
            ref_in = state.pop("full")
            rows = min(m, CHECK_ROWS)
            ref = _reference(ref_in["a"][:rows].float(), lambda n0, n1: ref_in["b"][n0:n1].float(), n)
            if ref_in["bias"] is not None:
                ref += ref_in["bias"].float()
            result = Check(rel_error(out[:rows], ref), bound, rows,
                           f"fp32 matmul of the whole layer's inputs, against the output combined over {world} ranks")
        checked = comm.broadcast_object(result, src=0)
        if not isinstance(checked, Check):
            raise RuntimeError("rank 0 sent no check result")
        return checked

    meta = {"call": "torch.nn.functional.linear" + (f" + {collectives[0]}" if collectives else ""),
            "dtype": args.a.dtype, "split": kind, "rule": rule, "rank_share": share}
    prepared = Prepared(fn=fn, check=check, metadata=meta, release=state.clear)
    return RankPrepared(prepared, flops=case.flops(), min_bytes=case.min_bytes(), collectives=collectives)
