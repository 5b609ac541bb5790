"""The torch MoE layer over W ranks: one rank's share of the whole layer, its collectives inside the call.

Three splits, as vLLM's FusedMoE runs them:
- `tp` (tp = W): every rank holds every expert with 1/W of its intermediate size (and 1/W of the
  shared experts'), routes all tokens, computes a partial output, and the partials are all-reduced;
  the bias of the down projection is added by rank 0 only;
- `tp·ep` (tp = ep = W): every rank routes all tokens but holds E/W whole experts (rank r the r-th
  block); pairs routed to other ranks' experts add nothing there; the partial outputs (and the
  tp-split shared experts') are all-reduced;
- `dp·ep` (dp = ep = W): every rank has its own batch of `tokens` tokens, routes it, and sends each
  token-expert pair to the rank holding the expert (`all_to_all_single`: the pair counts first, then
  the token rows and their local expert ids); the holder runs its experts' grouped GEMMs on what
  it received and sends the rows back the same way; the source combines them with its routing
  weights. The splits of the exchange are read on the host (a device synchronization per call on
  CUDA); the shared experts run whole on the rank's own batch.
The whole layer is the single-device layer of the same args (with `dp`: of all D batches, tokens
× D), built on every rank from its seed as the single-device backend builds it; each rank keeps
its share, and rank 0 checks the output combined over the ranks (gathered, for dp) against that
layer's fp32 reference (moe/reference.py), routing included.
Not built here, refused with the reason: other mixes of tp and dp, dp without ep, latent
projections, zero experts, a case that is already one rank's share (`experts.local`).
"""

from __future__ import annotations

from typing import Any, Literal, Optional

import torch
import torch.distributed as dist

from operatorx.backends.base import Check, Prepared
from operatorx.backends.check import CHECK_ROWS
from operatorx.backends.ranked import RankComm, RankPrepared, gather_function
from operatorx.backends.torch.memory import require_memory
from operatorx.backends.torch.moe import build, support
from operatorx.backends.torch.moe.experts import ExpertWeights, GroupedExperts
from operatorx.backends.torch.moe.layer import MoeLayer, TorchMoe, build_layer
from operatorx.backends.torch.moe.reference import check_layer
from operatorx.backends.torch.moe.router import RouterOutput, RouterWeights, TorchRouter
from operatorx.backends.torch.moe.shared import SharedExperts, SharedWeights
from operatorx.backends.torch.quant import torch_dtype
from operatorx.spec import Case
from operatorx.spec.moe import MoeArgs
from operatorx.spec.shard import ShardRefused

__all__ = ["MoeMode", "moe_mode", "moe_rank_refusal", "prepare_moe_ranks", "whole_layer_case"]

MoeMode = Literal["tp", "tp·ep", "dp·ep"]


def moe_mode(args: MoeArgs) -> MoeMode:
    """Which multi-rank MoE this split is (one device: `tp` over one rank, no collective); ShardRefused
    for the splits not built here."""
    p = args.parallel
    if p is None or p.world == 1:
        return "tp"
    if p.dp == 1 and p.ep == 1:
        return "tp"
    if p.dp == 1:
        return "tp·ep"
    if p.tp == 1 and p.ep > 1:
        return "dp·ep"
    why = "dp without ep (tokens all-gathered to tensor-parallel experts)" if p.ep == 1 else f"tp={p.tp} with dp={p.dp}"
    raise ShardRefused(f"{p.label()}: {why} is not built in the torch backend's multi-rank MoE yet")


def whole_layer_case(case: Case) -> Case:
    """The single-device case of the whole layer: no `parallel`; with dp, every dp batch (tokens × D)."""
    args = case.args
    assert isinstance(args, MoeArgs)
    data = args.model_dump(mode="json", exclude_none=True)
    data.pop("parallel", None)
    data["tokens"] = args.tokens * (args.parallel.dp if args.parallel is not None else 1)
    return Case.model_validate({"type": "moe", "args": data, "sources": list(case.sources)})


def _share_args(args: MoeArgs, mode: MoeMode, world: int) -> MoeArgs:
    """One rank's experts as a single-device layer (for the kernel and alignment refusals)."""
    data = args.model_dump(mode="json", exclude_none=True)
    data.pop("parallel", None)
    e = args.experts
    if mode == "tp":
        if e.inter % world:
            raise ShardRefused(f"experts.inter={e.inter} does not split {world} ways")
        data["experts"] = {**data["experts"], "inter": e.inter // world}
    else:
        if e.num % world:
            raise ShardRefused(f"experts.num={e.num} does not split {world} ways")
        data["experts"] = {**data["experts"], "local": e.num // world}
    if args.shared is not None and mode != "dp·ep":
        s = args.shared
        if (s.inter * s.count) % world:
            raise ShardRefused(f"shared.inter × count = {s.inter * s.count} does not split {world} ways")
        if s.inter % world == 0:
            data["shared"] = {**data["shared"], "inter": s.inter // world}
    return MoeArgs.model_validate(data)


def moe_rank_refusal(case: Case, device: str, world: int) -> Optional[str]:
    """Why the torch backend cannot run this MoE case over `world` ranks (None: it can)."""
    args = case.args
    assert isinstance(args, MoeArgs)
    e = args.experts
    if e.local is not None:
        return "experts.local: the case is already one rank's share, not a layer to split"
    if e.latent:
        return "experts.latent: latent projections are not built in the torch backend's multi-rank MoE yet"
    if e.zero:
        return "experts.zero: zero experts are not built in the torch backend's multi-rank MoE yet"
    try:
        mode = moe_mode(args)
        share = _share_args(args, mode, world)
    except (ShardRefused, ValueError) as err:
        return str(err)
    why = support.refusal(args if mode == "dp·ep" else share, device)
    scheme = support.experts_scheme(share, device)
    if why is None and scheme in ("bf16", "fp8_rowwise"):      # torch's grouped GEMM on every device
        why = support._alignment(share, scheme)  # type: ignore[arg-type]
    return f"one rank's share: {why}" if why and mode != "dp·ep" else why


def _gate_up_rows(inter: int, lo: int, hi: int, gated: bool, interleaved: bool, device: str) -> torch.Tensor:
    """The w1 rows holding intermediate channels lo..hi-1 (gate and up for a gated activation)."""
    span = torch.arange(lo, hi, device=device)
    if not gated:
        return span
    if interleaved:                       # alternating gate / up rows
        return torch.stack([2 * span, 2 * span + 1], dim=1).reshape(-1)
    return torch.cat([span, inter + span])


def _tp_experts(full: MoeLayer, rank: int, world: int, device: str) -> ExpertWeights:
    w, act = full.experts.w, full.args.activation
    inter = w.w2.shape[2]
    part = inter // world
    lo, hi = rank * part, (rank + 1) * part
    rows = _gate_up_rows(inter, lo, hi, act.is_gated, bool(act.interleaved), device)
    return ExpertWeights(w1=w.w1.index_select(1, rows), w2=w.w2[:, :, lo:hi].contiguous(),
                         s1=w.s1.index_select(1, rows) if w.s1 is not None else None, s2=w.s2,
                         b1=w.b1.index_select(1, rows) if w.b1 is not None else None,
                         b2=w.b2 if rank == 0 else None)          # the down bias once, before the reduction


def _ep_experts(full: MoeLayer, rank: int, world: int) -> ExpertWeights:
    w = full.experts.w
    part = w.num // world
    lo, hi = rank * part, (rank + 1) * part

    def block(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        return None if t is None else t[lo:hi].clone()

    w1, w2 = block(w.w1), block(w.w2)
    assert w1 is not None and w2 is not None
    return ExpertWeights(w1=w1, w2=w2, s1=block(w.s1), s2=block(w.s2), b1=block(w.b1), b2=block(w.b2))


def _tp_shared(full: MoeLayer, rank: int, world: int, device: str) -> Optional[SharedExperts]:
    if full.shared is None:
        return None
    sw, act = full.shared.w, full.args.activation
    inter = sw.w2.shape[1]
    part = inter // world
    lo, hi = rank * part, (rank + 1) * part
    rows = _gate_up_rows(inter, lo, hi, act.is_gated, bool(act.interleaved), device)
    local = SharedWeights(w1=sw.w1.index_select(0, rows), w2=sw.w2[:, lo:hi].contiguous(), gate=sw.gate,
                          s1=sw.s1.index_select(0, rows) if sw.s1 is not None else None, s2=sw.s2)
    return SharedExperts(local, act, full.shared.fp8_scales)


def _grouped(full: MoeLayer, weights: ExpertWeights, remote: bool) -> GroupedExperts:
    ex = full.experts
    fp8 = (ex.a1_scale, ex.a2_scale) if ex.fp8 else None
    return GroupedExperts(weights, full.args.activation, ex.weight_on_input, False, fp8,  # type: ignore[arg-type]
                          remote=remote)


class RankMoe:
    """One rank's MoE layer: `forward()` → (this rank's output, its routing), collectives inside."""

    def __init__(self, mode: MoeMode, full: MoeLayer, rank: int, world: int, comm: RankComm, device: str):
        self.mode, self.rank, self.world, self.group = mode, rank, world, comm.device_group
        self.out_dtype = torch_dtype(full.args.out)
        args = full.args
        if mode == "dp·ep":
            tokens = args.tokens // world
            lo, hi = rank * tokens, (rank + 1) * tokens
            self.x = full.x[lo:hi].contiguous()
            rw = full.router.w
            mine = RouterWeights(gate=rw.gate, correction_bias=rw.correction_bias, hash_table=rw.hash_table,
                                 token_ids=rw.token_ids[lo:hi] if rw.token_ids is not None else None)
            forced = full.router.forced[lo:hi] if full.router.forced is not None else None
            self.router = TorchRouter(args.router, args.experts.top_k, mine, forced)
            self.experts = _grouped(full, _ep_experts(full, rank, world), remote=False)
            self.shared = full.shared                    # whole, on the rank's own batch
        else:
            self.x, self.router = full.x, full.router
            if mode == "tp":
                self.experts = _grouped(full, _tp_experts(full, rank, world, device), remote=False)
            else:
                self.experts = _grouped(full, _ep_experts(full, rank, world), remote=True)
            self.shared = _tp_shared(full, rank, world, device)
        self.local = self.experts.w.num
        self.k = args.experts.top_k

    def _local_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """tp·ep: ids of this rank's experts as 0..L-1, every other id as L (another rank's: adds nothing)."""
        mine = ids - self.rank * self.local
        return torch.where((mine < 0) | (mine >= self.local), self.local, mine)

    def _exchange(self, r: RouterOutput) -> torch.Tensor:
        """dp·ep: dispatch each token-expert pair to its expert's rank, compute there, combine here (fp32)."""
        tokens, hidden, k = self.x.shape[0], self.x.shape[1], self.k
        flat = r.ids.reshape(-1)
        dest = torch.div(flat, self.local, rounding_mode="floor")
        order = torch.argsort(dest, stable=True)
        send_counts = torch.bincount(dest, minlength=self.world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        sends, recvs = send_counts.tolist(), recv_counts.tolist()       # host values: the splits
        rows_in = sum(recvs)
        send_x = self.x.index_select(0, torch.div(order, k, rounding_mode="floor"))
        send_e = flat.index_select(0, order) - dest.index_select(0, order) * self.local
        recv_x = self.x.new_empty(rows_in, hidden)
        recv_e = send_e.new_empty(rows_in)
        dist.all_to_all_single(recv_x, send_x, recvs, sends, group=self.group)
        dist.all_to_all_single(recv_e, send_e, recvs, sends, group=self.group)
        if self.experts.weight_on_input:
            send_w = r.weights.reshape(-1).index_select(0, order)
            recv_w = send_w.new_empty(rows_in)
            dist.all_to_all_single(recv_w, send_w, recvs, sends, group=self.group)
        else:
            recv_w = torch.ones(rows_in, device=self.x.device, dtype=r.weights.dtype)
        if rows_in:
            y = self.experts(recv_x, recv_e.unsqueeze(1), recv_w.unsqueeze(1)).to(self.x.dtype)
        else:
            y = self.x.new_empty(0, hidden)
        back = self.x.new_empty(tokens * k, hidden)
        dist.all_to_all_single(back, y, sends, recvs, group=self.group)
        per_pair = back.new_empty(tokens * k, hidden).index_copy_(0, order, back).view(tokens, k, hidden)
        if self.experts.weight_on_input:
            return per_pair.float().sum(dim=1)
        return torch.bmm(r.weights.unsqueeze(1), per_pair.float()).squeeze(1)

    def forward(self) -> tuple[torch.Tensor, RouterOutput]:
        r = self.router(self.x)
        if self.mode == "dp·ep":
            y = self._exchange(r)
        else:
            ids = self._local_ids(r.ids) if self.mode == "tp·ep" else r.ids
            y = self.experts(self.x, ids, r.weights)
        if self.shared is not None:
            y = y + self.shared(self.x).float()
        out = y.to(self.out_dtype)
        if self.mode != "dp·ep" and self.world > 1:
            dist.all_reduce(out, group=self.group)
        return out, r

    def __call__(self) -> torch.Tensor:
        return self.forward()[0]


def _gathered(t: torch.Tensor, world: int, group: Any) -> torch.Tensor:
    gather, _ = gather_function()
    t = t.contiguous()
    out = t.new_empty((world * t.shape[0], *t.shape[1:]))
    gather(out, t, group=group)
    return out


def prepare_moe_ranks(case: Case, device: str, comm: RankComm) -> RankPrepared:
    """This rank's share of the MoE layer and the call that runs it with its collectives."""
    args = case.args
    assert isinstance(args, MoeArgs)
    mode = moe_mode(args)
    rank, world = comm.rank, comm.world
    whole = whole_layer_case(case)
    whole_args = whole.args
    assert isinstance(whole_args, MoeArgs)
    require_memory(build.device_bytes(whole_args, min(whole_args.tokens, CHECK_ROWS)), device)
    full = build_layer(whole, device)                   # the whole layer, as the single-device backend builds it
    _, routed_all = full.forward(full.x)                # the routing of every token, for the metadata
    meta = TorchMoe._metadata(whole_args, full, routed_all)
    layer = RankMoe(mode, full, rank, world, comm, device)
    state: dict[str, Any] = {"layer": layer}
    if rank == 0:
        state["full"] = full                            # the check's reference layer (rank 0 only)
    del full, routed_all
    name = comm.backend_name
    collectives = ([] if world == 1 else [f"all_to_all_single (splits, then rows; {name})"] if mode == "dp·ep"
                   else [f"all_reduce ({name})"])

    def fn() -> torch.Tensor:
        return state["layer"]()

    def check() -> Check:
        out, routed = state["layer"].forward()          # collective: every rank makes the call
        if mode == "dp·ep":                             # every rank's batch, in rank order
            out = _gathered(out, world, comm.device_group)
            routed = RouterOutput(ids=_gathered(routed.ids, world, comm.device_group),
                                  weights=_gathered(routed.weights, world, comm.device_group),
                                  logits=_gathered(routed.logits, world, comm.device_group))
        result: Optional[Check] = None
        if rank == 0:
            ref = state.pop("full")
            got = check_layer(ref, out, routed, CHECK_ROWS)
            result = Check(got.rel_error, got.bound, got.rows_checked,
                           f"{got.reference}; the whole layer against the output combined over {world} ranks "
                           f"({mode})")
        checked = comm.broadcast_object(result, src=0)
        if not isinstance(checked, Check):
            raise RuntimeError("rank 0 sent no check result")
        return checked

    calls = dict(meta["calls"])
    calls["parallel"] = {"tp": "experts' intermediate split over the ranks, partial outputs all-reduced",
                         "tp·ep": "whole experts split over the ranks, all tokens on every rank, partial outputs "
                                  "all-reduced",
                         "dp·ep": "each rank's own batch; token-expert pairs sent to the expert's rank and back "
                                  "with all_to_all_single (splits read on the host)"}[mode]
    meta = {**meta, "calls": calls, "split": mode, "rank_experts": layer.local}
    prepared = Prepared(fn=fn, check=check, metadata=meta, release=state.clear)
    return RankPrepared(prepared, flops=whole_args.flops(),
                        min_bytes=whole_args.min_bytes(experts_hit=meta["experts_hit"]), collectives=collectives)
