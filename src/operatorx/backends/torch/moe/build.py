"""Allocate one MoE layer's inputs and weights on the device, outside the timed region.

Weights are random with unit-variance outputs (std 1/sqrt(K)). Only the experts the case's
routing actually hits get random weights; the others are zeros that no grouped GEMM reads
(their groups are empty). The memory footprint is the full layer's either way, as in serving.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from operatorx.backends.torch.moe.experts import ExpertWeights
from operatorx.backends.torch.moe.router import RouterWeights
from operatorx.backends.torch.moe.shared import SharedWeights
from operatorx.backends.torch.quant import quantize, torch_dtype
from operatorx.spec.moe import HashSelect, MoeArgs
from operatorx.spec.operand import Operand

__all__ = ["LatentWeights", "device_bytes", "router_weights", "expert_weights", "shared_weights",
           "latent_weights"]

_SLACK = 1 << 26


@dataclass
class LatentWeights:
    down: torch.Tensor                    # [L, H] bf16
    up: torch.Tensor                      # [H, L] bf16
    norm: Optional[torch.Tensor] = None   # [L] bf16 RMSNorm weight on the latent input


def _rows1(args: MoeArgs, inter: int) -> int:
    return 2 * inter if args.activation.is_gated else inter


def device_bytes(args: MoeArgs, check_rows: int) -> int:
    """Bytes the prepared case holds at its peak: weights, the call's activations, the check."""
    e, t, h, w = args.experts, args.tokens, args.hidden, args.width
    rows1 = _rows1(args, e.inter)
    routable = e.num + (e.zero or 0)
    total = e.held * (e.w1.bytes(rows1, w, weight=True) + e.w2.bytes(w, e.inter, weight=True))
    if e.bias:
        total += e.held * (rows1 + w) * 2
    total += routable * h * torch_dtype(args.router.gate.dtype).itemsize + routable * 4
    if isinstance(args.router.select, HashSelect):
        total += args.router.select.vocab * e.top_k * 8
    if e.latent:
        total += 2 * h * w * 2 + w * 2
    if args.shared is not None:
        s = args.shared
        srows = _rows1(args, s.inter * s.count)
        total += s.w1.bytes(srows, h, weight=True) + s.w2.bytes(h, s.inter * s.count, weight=True) + h * 2
        total += t * (srows + s.inter * s.count + h) * 2
    tk = t * e.top_k
    total += t * h * 2 * 3 + t * routable * 4 * 3                       # x, latent x, out; logits and scores
    total += tk * (w * (2 + 2 + 2 + 4) + rows1 * 2 * 2 + e.inter * 2 + 32)  # permuted x, h, a, y, combine
    # the check: one expert's fp32 weights, and fp32 rows of every intermediate
    total += (rows1 * w + w * e.inter) * 4 * 2 + check_rows * e.top_k * (w + rows1 + e.inter) * 4 * 2
    if e.w1.dtype != "bf16":
        total += (rows1 * w + w * e.inter) * 2   # one expert in bf16 before quantizing
    return total + _SLACK


def router_weights(args: MoeArgs, device: str, gen: torch.Generator) -> RouterWeights:
    e, h = args.experts, args.hidden
    routable = e.num + (e.zero or 0)
    gate = torch.randn(routable, h, generator=gen, device=device, dtype=torch.float32) / h ** 0.5
    rw = RouterWeights(gate=gate.to(torch_dtype(args.router.gate.dtype)), correction_bias=None)
    if args.router.bias:
        rw.correction_bias = 0.1 * torch.randn(routable, generator=gen, device=device)
    sel = args.router.select
    if isinstance(sel, HashSelect):
        cpu = torch.Generator().manual_seed(args.routing.seed)
        noise = torch.rand(sel.vocab, routable, generator=cpu)
        rw.hash_table = noise.topk(e.top_k, dim=-1).indices.to(device)     # k distinct experts per token id
        rw.token_ids = torch.randint(sel.vocab, (args.tokens,), generator=cpu).to(device)
    return rw


def _random(shape: tuple[int, ...], std: float, device: str, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, device=device, dtype=torch.bfloat16).mul_(std)


def _fill(w: torch.Tensor, s: Optional[torch.Tensor], e: int, op: Operand, std: float,
          device: str, gen: torch.Generator) -> None:
    rows, cols = w.shape[1:]
    x = _random((rows, cols), std, device, gen)
    if s is None:
        w[e] = x
        return
    assert op.scale is not None
    q, sc = quantize(x, op.dtype, op.scale, weight=True)
    w[e], s[e] = q, sc.reshape(-1)


def expert_weights(args: MoeArgs, hit: list[int], device: str, gen: torch.Generator) -> ExpertWeights:
    e, w = args.experts, args.width
    rows1 = _rows1(args, e.inter)
    dt = torch_dtype(e.w1.dtype)
    quantized = e.w1.dtype != "bf16"
    def zeros(*shape: int) -> torch.Tensor:   # fp8 zeros as zero bytes (+0.0), no fp8 fill kernel needed
        if not quantized:
            return torch.zeros(*shape, device=device, dtype=dt)
        return torch.zeros(*shape, device=device, dtype=torch.uint8).view(dt)

    n = e.held                                # the experts this device holds (`experts.local`)
    ew = ExpertWeights(w1=zeros(n, rows1, w), w2=zeros(n, w, e.inter))
    if quantized:
        ew.s1 = torch.ones(n, rows1, device=device)
        ew.s2 = torch.ones(n, w, device=device)
    if e.bias:
        ew.b1 = torch.zeros(n, rows1, device=device, dtype=torch.bfloat16)
        ew.b2 = torch.zeros(n, w, device=device, dtype=torch.bfloat16)
    for x in hit:
        _fill(ew.w1, ew.s1, x, e.w1, w ** -0.5, device, gen)
        _fill(ew.w2, ew.s2, x, e.w2, e.inter ** -0.5, device, gen)
        if ew.b1 is not None and ew.b2 is not None:
            ew.b1[x] = _random((rows1,), 0.1, device, gen)
            ew.b2[x] = _random((w,), 0.1, device, gen)
    return ew


def shared_weights(args: MoeArgs, device: str, gen: torch.Generator) -> Optional[SharedWeights]:
    s = args.shared
    if s is None:
        return None
    h, inter = args.hidden, s.inter * s.count
    rows1 = _rows1(args, inter)
    w1, w2 = _random((rows1, h), h ** -0.5, device, gen), _random((h, inter), inter ** -0.5, device, gen)
    sw = SharedWeights(w1=w1, w2=w2)
    if s.w1.dtype != "bf16":
        assert s.w1.scale is not None and s.w2.scale is not None
        sw.w1, s1 = quantize(w1, s.w1.dtype, s.w1.scale, weight=True)
        sw.w2, s2 = quantize(w2, s.w2.dtype, s.w2.scale, weight=True)
        sw.s1, sw.s2 = s1.reshape(-1), s2.reshape(-1)
    if s.gate == "sigmoid":
        sw.gate = _random((1, h), h ** -0.5, device, gen)
    return sw


def latent_weights(args: MoeArgs, device: str, gen: torch.Generator) -> Optional[LatentWeights]:
    lat = args.experts.latent
    if not lat:
        return None
    h = args.hidden
    lw = LatentWeights(down=_random((lat, h), h ** -0.5, device, gen), up=_random((h, lat), lat ** -0.5, device, gen))
    if args.experts.latent_norm:
        lw.norm = (1.0 + 0.1 * torch.randn(lat, generator=gen, device=device)).to(torch.bfloat16)
    return lw
