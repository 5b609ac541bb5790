"""The torch collective: one torch.distributed collective on the case's group, timed on its own.

The call is the collective on the group the run gives: the rank path's device group over W ranks
(gloo on the CPU, NCCL on CUDA), or, for a one-rank case on the single-device path, a group of the
worker alone (backends/torch/one_rank.py). Buffers as NCCL-tests sizes them (spec/collective.py):
- all_reduce: `torch.distributed.all_reduce` of each rank's buffer of `elements`, in place (as vLLM's
  NCCL all_reduce runs); the values grow call after call, which does not change the call's time;
- all_gather: each rank's elements/W into the gathered `elements` (all_gather_single, or
  all_gather_into_tensor before torch 2.13);
- reduce_scatter: each rank's `elements` into its reduced elements/W (reduce_scatter_single, or
  reduce_scatter_tensor before torch 2.13);
- all_to_all: `all_to_all_single`, elements/W from every rank to every rank.
Each rank's input comes from the case's seed and the rank alone, so any rank can rebuild any other's.
The values are small integers: every partial sum of a reduction is exact in the dtype whatever order
the library adds in, so the check is exact. Every rank compares its own output with the collective's
result computed locally in fp32 from all ranks' inputs; the counts are summed over the group.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import Any, Optional

import torch
import torch.distributed as dist

from operatorx.backends.base import Check, Prepared, Unsupported
from operatorx.backends.ranked import RankComm, RankPrepared, gather_function
from operatorx.backends.refusal import library_refusal
from operatorx.backends.torch.memory import require_memory
from operatorx.backends.torch.quant import TORCH_DTYPES
from operatorx.spec import Case
from operatorx.spec.collective import REDUCING, CollectiveArgs

__all__ = ["TorchCollective", "collective_refusal", "EXACT_INTEGER"]

#: The largest n such that every integer in [-n, n] is exact in the dtype.
EXACT_INTEGER: dict[str, int] = {"bf16": 256, "fp16": 2048, "fp32": 2**24, "e4m3": 16, "e5m2": 8, "int8": 127}
_DTYPES: dict[str, torch.dtype] = {**TORCH_DTYPES, "int8": torch.int8}
_FLOAT8 = frozenset({"e4m3", "e5m2"})
#: Words of torch's refusal of a dtype or an op on a process group's backend (gloo's "Invalid scalar type").
_DTYPE_REFUSALS = ("scalar type", "float8", "dtype", "unsupported")


def collective_refusal(case: Case, device: str) -> Optional[str]:
    """Why the torch backend cannot run this collective on `device` (None: it can)."""
    args = case.args
    assert isinstance(args, CollectiveArgs)
    if device == "cpu" and args.dtype in _FLOAT8:
        return (f"dtype={args.dtype}: gloo (the CPU device's process group) has no float8 types "
                "(torch's gloo refuses them: Invalid scalar type)")
    return None


def _rank_seed(seed: int, rank: int) -> int:
    return int(hashlib.sha256(f"{seed}/{rank}".encode()).hexdigest()[:15], 16)


def _value_bound(args: CollectiveArgs, rank: int) -> int:
    """The largest |value| rank `rank` holds: a reduction's W values then sum within the dtype's exact
    integers (ranks past that many hold zeros); other kinds use the whole exact range."""
    limit = EXACT_INTEGER[args.dtype]
    if args.kind not in REDUCING:
        return limit
    return 0 if rank >= limit else max(1, limit // args.world)


def _rank_input(case: Case, rank: int, count: int, device: str) -> torch.Tensor:
    """Rank `rank`'s input: `count` integers from the case's seed and the rank, in the case's dtype."""
    args = case.args
    assert isinstance(args, CollectiveArgs)
    bound = _value_bound(args, rank)
    gen = torch.Generator(device=device).manual_seed(_rank_seed(case.seed(), rank))
    values = torch.randint(-bound, bound + 1, (count,), generator=gen, device=device, dtype=torch.float32)
    return values.to(_DTYPES[args.dtype])


def _reduce_scatter_function() -> tuple[Any, str]:
    fn = getattr(dist, "reduce_scatter_single", None)
    if fn is not None:
        return fn, "reduce_scatter_single"
    return dist.reduce_scatter_tensor, "reduce_scatter_tensor"


def _refusal(err: BaseException) -> Optional[str]:
    said = library_refusal(err)
    if said is not None:
        return said
    text = str(err).strip()
    if isinstance(err, (RuntimeError, ValueError, AttributeError)) and any(w in text.lower() for w in _DTYPE_REFUSALS):
        return (text.splitlines()[0] if text else type(err).__name__)[:400]
    return None


def prepare_collective(case: Case, device: str, rank: int, world: int, group: Any, backend: str) -> RankPrepared:
    """This rank's buffers and the one collective call on `group`, with its exact check."""
    args = case.args
    assert isinstance(args, CollectiveArgs)
    if world != args.world:
        raise ValueError(f"a tp={args.world} collective was given a group of {world}")
    kind, n, item = args.kind, args.elements, args.element_bytes
    part = n // world
    in_count = part if kind == "all_gather" else n
    out_count = part if kind == "reduce_scatter" else n
    require_memory((in_count + out_count) * item + out_count * 8 + in_count * (4 + item) + (1 << 26), device)
    x = _rank_input(case, rank, in_count, device)
    state: dict[str, Any] = {"x": x}
    call: Callable[[], torch.Tensor]
    if kind == "all_reduce":
        state["out"] = x.clone()
        name = "all_reduce"

        def call() -> torch.Tensor:
            dist.all_reduce(state["out"], group=group)
            return state["out"]
    else:
        state["out"] = torch.empty(out_count, dtype=x.dtype, device=device)
        if kind == "all_gather":
            op, name = gather_function()
        elif kind == "reduce_scatter":
            op, name = _reduce_scatter_function()
        else:
            op, name = dist.all_to_all_single, "all_to_all_single"

        def call() -> torch.Tensor:
            op(state["out"], state["x"], group=group)
            return state["out"]
    try:
        call()                                   # torch refuses a dtype or op here, alike on every rank
    except Exception as err:  # noqa: BLE001 - a refusal is unsupported; anything else propagates
        why = _refusal(err)
        if why is None:
            raise
        raise Unsupported(f"torch.distributed {name} of {args.dtype} on {backend}: {why}") from err
    collective = f"{name} ({backend})"

    def check() -> Check:
        if kind == "all_reduce":
            state["out"].copy_(state["x"])       # the seed's inputs again: the timed calls reduce in place
        got = call().float()                     # collective: every rank makes the call
        want = torch.zeros(out_count, dtype=torch.float32, device=device)
        for j in range(world):
            xj = (state["x"] if j == rank else _rank_input(case, j, in_count, device)).float()
            mine = xj[rank * part:(rank + 1) * part]
            if kind == "all_reduce":
                want += xj
            elif kind == "all_gather":
                want[j * part:(j + 1) * part] = xj
            elif kind == "reduce_scatter":
                want += mine
            else:
                want[j * part:(j + 1) * part] = mine
        diff = got - want
        counts = torch.stack([torch.sum(diff * diff, dtype=torch.float64), torch.sum(want * want, dtype=torch.float64),
                              (got != want).sum().to(torch.float64),
                              torch.tensor(float(out_count), dtype=torch.float64, device=device)])
        dist.all_reduce(counts, group=group)
        err2, ref2, bad, checked = counts.tolist()
        rel = math.sqrt(err2 / ref2) if ref2 > 0 else (0.0 if err2 == 0 else math.inf)
        return Check(rel, 0.0, int(checked),
                     f"exact: every rank's output against the {kind} of all {world} ranks' seeded inputs, computed "
                     f"locally in fp32 (small integers, exact in {args.dtype} in any order of addition); "
                     f"{int(bad)} of {int(checked)} elements differ")

    meta = {"call": f"torch.distributed.{name}", "group": backend, "kind": kind, "dtype": args.dtype,
            "in_elements_per_rank": in_count, "out_elements_per_rank": out_count,
            "collective_bytes": args.size_bytes}
    prepared = Prepared(fn=call, check=check, metadata=meta, release=state.clear)
    return RankPrepared(prepared, flops=case.flops(), min_bytes=case.min_bytes(), collectives=[collective])


class TorchCollective:
    """The torch backend of `collective` cases: over W ranks (RankedBackend) or one (the single-device path)."""

    name = "torch"
    op_type = "collective"

    def supports(self, case: Case, device: str) -> Optional[str]:
        return collective_refusal(case, device)

    def supports_ranks(self, case: Case, device: str, world: int) -> Optional[str]:
        return collective_refusal(case, device)

    def prepare_ranks(self, case: Case, device: str, comm: RankComm) -> RankPrepared:
        """This rank's part of the collective on the rank path's device group."""
        return prepare_collective(case, device, comm.rank, comm.world, comm.device_group, comm.backend_name)

    def prepare(self, case: Case, device: str) -> Prepared:
        """A one-rank collective (W = 1) on a group of this worker alone."""
        from operatorx.backends.torch.one_rank import one_rank_group

        group, backend = one_rank_group(device)
        prepared = prepare_collective(case, device, 0, 1, group, backend).prepared
        prepared.metadata["group"] = f"{backend}, one rank: this worker alone"
        return prepared
