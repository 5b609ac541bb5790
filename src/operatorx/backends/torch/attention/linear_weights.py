"""Random weights and per-request states of one linear-attention module (gdn, kda), as vLLM 0.26 stores them.

Weights, each in the dtype vLLM's module holds it (so loading is exact and the fp32 reference reads
the very values the module computes with):
- gdn (Qwen3.5's QwenGatedDeltaNetAttention): in_proj_qkv [2·qk_heads·d + v_heads·d, hidden] (q, k, v
  rows), in_proj_z [v_heads·d, hidden], in_proj_b / in_proj_a [v_heads, hidden], conv1d [conv_dim,
  conv_kernel], dt_bias [v_heads] (bf16: the module's torch.ones under the bf16 default dtype),
  A_log [v_heads] fp32, norm [d], out_proj [hidden, v_heads·d]; all bf16 unless said;
- kda (KimiGatedDeltaNetAttention): q/k/v [heads·d, hidden], f_a [d, hidden], f_b [heads·d, d],
  b [heads, hidden], g_a [d, hidden], g_b [heads·d, d] (the output gate, low rank d as vLLM builds
  it), q/k/v conv [heads·d, conv_kernel] fp32, A_log [heads] fp32, dt_bias [heads·d] fp32, o_norm [d],
  o_proj [hidden, heads·d].
Values: projections N(0, 1/in) (unit-variance outputs); conv taps N(0, 1/conv_kernel); A = exp(A_log)
uniform in [1, 16] and dt_bias = softplus⁻¹(dt), dt uniform in [1e-3, 1e-1] (Mamba's init: decays
exp(g) spread over (0, 1)); norms near 1. Why random, not zeros or ones: a wrong wiring shows.

States of one request as the kernels index them: conv [conv_dim, conv_kernel - 1] (the last inputs,
newest last) and ssm [heads, d_v, d_k] (vLLM's h[v, k]). `random_states` draws format-valid ones:
conv values N(0, 1) (the projections' scale), ssm N(0, 1/d) (a unit-norm k's outer products summed
over a few tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import torch

from operatorx.spec.attention import GdnArgs, KdaArgs

__all__ = ["GdnWeights", "KdaWeights", "LinearWeights", "RequestState", "linear_weights", "random_states",
           "conv_channels", "state_heads", "STATE_DTYPES"]

#: `state_dtype` -> the torch dtype of the recurrent state.
STATE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class GdnWeights:
    qkv: torch.Tensor
    z: torch.Tensor
    b: torch.Tensor
    a: torch.Tensor
    conv: torch.Tensor
    dt_bias: torch.Tensor
    A_log: torch.Tensor
    norm: torch.Tensor
    out: torch.Tensor


@dataclass
class KdaWeights:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    f_a: torch.Tensor
    f_b: torch.Tensor
    b: torch.Tensor
    g_a: torch.Tensor
    g_b: torch.Tensor
    q_conv: torch.Tensor
    k_conv: torch.Tensor
    v_conv: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    o_norm: torch.Tensor
    o: torch.Tensor


LinearWeights = Union[GdnWeights, KdaWeights]


@dataclass
class RequestState:
    """One request's state: conv [conv_dim, conv_kernel - 1] and ssm [heads, d, d] (h[v, k])."""

    conv: torch.Tensor
    ssm: torch.Tensor


def conv_channels(args: Union[GdnArgs, KdaArgs]) -> int:
    """Channels of the causal conv: q, k and v of every head."""
    if isinstance(args, GdnArgs):
        return (2 * args.qk_heads + args.v_heads) * args.head_dim
    return 3 * args.heads * args.head_dim


def state_heads(args: Union[GdnArgs, KdaArgs]) -> int:
    """Heads of the recurrent state (gdn: one per v head)."""
    return args.v_heads if isinstance(args, GdnArgs) else args.heads


def _linear(out_features: int, in_features: int, gen: torch.Generator, device: str) -> torch.Tensor:
    w = torch.randn(out_features, in_features, generator=gen, device=device, dtype=torch.float32)
    return (w / math.sqrt(in_features)).to(torch.bfloat16)


def _norm(width: int, gen: torch.Generator, device: str) -> torch.Tensor:
    return (1 + 0.1 * torch.randn(width, generator=gen, device=device, dtype=torch.float32)).to(torch.bfloat16)


def _uniform(n: int, lo: float, hi: float, gen: torch.Generator, device: str) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(n, generator=gen, device=device, dtype=torch.float32)


def _decay(n: int, gen: torch.Generator, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(A_log, dt_bias) fp32 of n decay channels (module docstring)."""
    a_log = torch.log(_uniform(n, 1.0, 16.0, gen, device))
    dt = _uniform(n, 1e-3, 1e-1, gen, device)
    return a_log, dt + torch.log(-torch.expm1(-dt))          # softplus⁻¹(dt)


def linear_weights(args: Union[GdnArgs, KdaArgs], gen: torch.Generator, device: str) -> LinearWeights:
    h, d, kernel = args.hidden, args.head_dim, args.conv_kernel
    conv_scale = 1 / math.sqrt(kernel)
    if isinstance(args, GdnArgs):
        vd = args.v_heads * d
        conv = torch.randn(conv_channels(args), kernel, generator=gen, device=device, dtype=torch.float32) * conv_scale
        a_log, dt_bias = _decay(args.v_heads, gen, device)
        return GdnWeights(qkv=_linear(2 * args.qk_heads * d + vd, h, gen, device), z=_linear(vd, h, gen, device),
                          b=_linear(args.v_heads, h, gen, device), a=_linear(args.v_heads, h, gen, device),
                          conv=conv.to(torch.bfloat16), dt_bias=dt_bias.to(torch.bfloat16), A_log=a_log,
                          norm=_norm(d, gen, device), out=_linear(h, vd, gen, device))
    p = args.heads * d
    convs = [torch.randn(p, kernel, generator=gen, device=device, dtype=torch.float32) * conv_scale
             for _ in range(3)]
    a_log, _ = _decay(args.heads, gen, device)
    _, dt_bias = _decay(p, gen, device)
    return KdaWeights(q=_linear(p, h, gen, device), k=_linear(p, h, gen, device), v=_linear(p, h, gen, device),
                      f_a=_linear(d, h, gen, device), f_b=_linear(p, d, gen, device),
                      b=_linear(args.heads, h, gen, device), g_a=_linear(d, h, gen, device),
                      g_b=_linear(p, d, gen, device), q_conv=convs[0], k_conv=convs[1], v_conv=convs[2],
                      A_log=a_log, dt_bias=dt_bias, o_norm=_norm(d, gen, device), o=_linear(h, p, gen, device))


def random_states(args: Union[GdnArgs, KdaArgs], count: int, gen: torch.Generator,
                  device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(conv [count, conv_dim, conv_kernel - 1] bf16, ssm [count, heads, d, d] in state_dtype): format-valid
    states of `count` requests (module docstring)."""
    d = args.head_dim
    conv = torch.randn(count, conv_channels(args), args.conv_kernel - 1, generator=gen, device=device,
                       dtype=torch.float32)
    ssm = torch.randn(count, state_heads(args), d, d, generator=gen, device=device, dtype=torch.float32) / math.sqrt(d)
    return conv.to(torch.bfloat16), ssm.to(STATE_DTYPES[args.state_dtype])
