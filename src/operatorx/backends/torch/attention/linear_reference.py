"""The fp32 reference of one linear-attention module (gdn, kda), request by request, token by token.

For each reference request (the first and the last of every batch group) every new token is run in
fp32 from the same bf16 weights and inputs, from the request's state as the backend holds it (zeros
when ctx = 0: no initial state). Each step is vLLM 0.26's, named where it lives:
- projections (gdn: in_proj_qkvz = [q; k; v; z], in_proj_ba = [b; a], Qwen3.5's layout; kda: q/k/v,
  b_proj, f_a_proj -> f_b_proj, g_a_proj -> g_b_proj);
- the causal depthwise conv over the q, k, v channels, its state the K-1 inputs before the first new
  token, then silu (causal_conv1d_fn / causal_conv1d_update, mamba/ops/causal_conv1d.py); the new state
  is the last K-1 inputs;
- q and k l2-normalised, x / sqrt(Σx² + 1e-6) (fused_post_conv_prep, fused_sigmoid_gating's and
  fused_recurrent's use_qk_l2norm_in_kernel), q scaled by head_dim^-0.5;
- the gates: gdn g = -exp(A_log)·softplus(a + dt_bias) per v head, beta = sigmoid(b) (fused_gdn_gating,
  fused_post_conv_prep); kda g = -exp(A_log[head])·softplus(f_b(f_a(x)) + dt_bias) per channel
  (fused_kda_gate / kda_gate_fwd_kernel), beta = sigmoid(b_proj(x)); softplus linear above 20;
- the gated delta rule on h[v, k] (fused_recurrent_gated_delta_rule_fwd_kernel): h *= exp(g) (kda: along
  k), v' = beta·(v - h k), h += v' kᵀ, o = h q; a v head reads qk head hv // (v_heads / qk_heads);
- the gated RMSNorm over each head's d: gdn norm(o)·w·act(z), act silu or sigmoid (RMSNormGated,
  norm_before_gate, eps = the config's rms_norm_eps); kda norm(o)·w·sigmoid(g_b(g_a(x)))
  (FusedRMSNormGated, eps 1e-5); then out_proj / o_proj.
Why token by token: it is the recurrence's definition, so it checks the chunked prefill kernels by
different arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Union

import torch
import torch.nn.functional as F

from operatorx.backends.torch.attention.gqa import RMS_EPS
from operatorx.backends.torch.attention.layout import Layout, Request
from operatorx.backends.torch.attention.linear_weights import (
    GdnWeights,
    KdaWeights,
    LinearWeights,
    RequestState,
    conv_channels,
    state_heads,
)
from operatorx.backends.torch.attention.reference import reference_requests
from operatorx.spec.attention import GdnArgs, KdaArgs

__all__ = ["L2_EPS", "GDN_NORM_EPS", "KDA_NORM_EPS", "LinearReference", "StateOf", "causal_conv", "l2norm",
           "delta_rule", "gated_rms_norm", "gdn_request", "kda_request", "zero_state", "linear_reference"]

#: The l2 norm's epsilon inside vLLM's FLA kernels.
L2_EPS = 1e-6
#: gdn's gated norm epsilon: the config's rms_norm_eps the vllm backend builds the module with.
GDN_NORM_EPS = RMS_EPS
#: kda's FusedRMSNormGated default (KimiGatedDeltaNetAttention passes none).
KDA_NORM_EPS = 1e-5

#: request -> its state (fp32 or as stored) before the call, as the backend holds it.
StateOf = Callable[[Request], RequestState]


@dataclass(frozen=True)
class LinearReference:
    rows: torch.Tensor
    """int64 indices into the module's T output rows (layout order)."""
    out: torch.Tensor
    """fp32 [len(rows), hidden]."""
    requests: tuple[Request, ...]
    final: tuple[RequestState, ...]
    """Each reference request's state after the call (fp32)."""
    what: str


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def causal_conv(u: torch.Tensor, weight: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(silu(conv) [n, C], new state [C, K-1]) of inputs u [n, C] with taps weight [C, K] after state [C, K-1]."""
    taps = weight.shape[1]
    full = torch.cat([state.t(), u], dim=0)                       # [K-1 + n, C]
    windows = full.unfold(0, taps, 1)                             # [n, C, K]
    return F.silu((windows * weight).sum(-1)), full[full.shape[0] - (taps - 1):].t()


def delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               h0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(o [n, H, V], h [H, V, K]) of the gated delta rule (module docstring) from h0 [H, V, K].

    q, k [n, Hq, K] (normed, q scaled), v [n, H, V], beta [n, H], g [n, H] (one decay a head) or
    [n, H, K] (one a key channel); H / Hq v heads share a qk head.
    """
    group = v.shape[1] // q.shape[1]
    q, k = q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1)
    h = h0.clone()
    out = []
    for t in range(q.shape[0]):
        decay = g[t].exp()
        h = h * (decay[:, None, None] if decay.dim() == 1 else decay[:, None, :])
        u = beta[t][:, None] * (v[t] - torch.einsum("hvk,hk->hv", h, k[t]))
        h = h + u[:, :, None] * k[t][:, None, :]
        out.append(torch.einsum("hvk,hk->hv", h, q[t]))
    return torch.stack(out), h


def gated_rms_norm(o: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, act: str) -> torch.Tensor:
    """rms_norm(o) · weight · act(gate) over the last dim."""
    normed = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * weight
    return normed * (torch.sigmoid(gate) if act == "sigmoid" else F.silu(gate))


def _heads(x: torch.Tensor, d: int) -> torch.Tensor:
    return x.reshape(x.shape[0], -1, d)


def gdn_request(args: GdnArgs, w: GdnWeights, x: torch.Tensor, s: RequestState) -> tuple[torch.Tensor, RequestState]:
    """(out [n, hidden], final state) of one request's n new tokens x [n, hidden] (fp32)."""
    d, kd = args.head_dim, args.qk_heads * args.head_dim
    f = {name: getattr(w, name).float() for name in ("qkv", "z", "b", "a", "conv", "dt_bias", "A_log", "norm", "out")}
    mixed, conv = causal_conv(x @ f["qkv"].t(), f["conv"], s.conv.float())
    q, k, v = _heads(mixed[:, :kd], d), _heads(mixed[:, kd:2 * kd], d), _heads(mixed[:, 2 * kd:], d)
    g = -f["A_log"].exp() * F.softplus(x @ f["a"].t() + f["dt_bias"])
    beta = torch.sigmoid(x @ f["b"].t())
    o, h = delta_rule(l2norm(q) * d ** -0.5, l2norm(k), v, g, beta, s.ssm.float())
    o = gated_rms_norm(o, _heads(x @ f["z"].t(), d), f["norm"], GDN_NORM_EPS, args.norm_act)
    return o.reshape(o.shape[0], -1) @ f["out"].t(), RequestState(conv, h)


def kda_request(args: KdaArgs, w: KdaWeights, x: torch.Tensor, s: RequestState) -> tuple[torch.Tensor, RequestState]:
    """(out [n, hidden], final state) of one request's n new tokens x [n, hidden] (fp32)."""
    d, p = args.head_dim, args.heads * args.head_dim
    f = {name: getattr(w, name).float() for name in KdaWeights.__dataclass_fields__}
    state = s.conv.float()
    parts, convs = [], []
    for i, name in enumerate(("q", "k", "v")):
        y, c = causal_conv(x @ f[name].t(), f[f"{name}_conv"], state[i * p:(i + 1) * p])
        parts.append(_heads(y, d))
        convs.append(c)
    raw = (x @ f["f_a"].t()) @ f["f_b"].t() + f["dt_bias"]
    g = -f["A_log"].reshape(1, -1, 1).exp() * F.softplus(_heads(raw, d))
    beta = torch.sigmoid(x @ f["b"].t())
    o, h = delta_rule(l2norm(parts[0]) * d ** -0.5, l2norm(parts[1]), parts[2], g, beta, s.ssm.float())
    gate = _heads((x @ f["g_a"].t()) @ f["g_b"].t(), d)
    o = gated_rms_norm(o, gate, f["o_norm"], KDA_NORM_EPS, "sigmoid")
    return o.reshape(o.shape[0], -1) @ f["o"].t(), RequestState(torch.cat(convs), h)


def zero_state(args: Union[GdnArgs, KdaArgs], device: Union[str, torch.device]) -> RequestState:
    """A request without a context: conv and ssm state zero (vLLM's has_initial_state False)."""
    d = args.head_dim
    return RequestState(torch.zeros(conv_channels(args), args.conv_kernel - 1, device=device),
                        torch.zeros(state_heads(args), d, d, device=device))


def linear_reference(args: Union[GdnArgs, KdaArgs], weights: LinearWeights, x: torch.Tensor, layout: Layout,
                     state_of: StateOf) -> LinearReference:
    """Every new token of the reference requests (module docstring); x [T, hidden] in layout order."""
    run = gdn_request if isinstance(args, GdnArgs) else kda_request
    rows, outs, finals = [], [], []
    picked = tuple(reference_requests(layout))
    for r in picked:
        start = state_of(r) if r.ctx > 0 else zero_state(args, x.device)
        out, final = run(args, weights, x[r.row0:r.row0 + r.q].float(), start)  # type: ignore[arg-type]
        rows.append(torch.arange(r.row0, r.row0 + r.q, dtype=torch.int64))
        outs.append(out)
        finals.append(final)
    what = (f"fp32 {args.TYPE} module token by token (conv, l2-normed q/k, gated delta rule, gated RMSNorm) over "
            f"{len(picked)} requests (first and last of each group), {sum(r.q for r in picked)} rows")
    return LinearReference(torch.cat(rows), torch.cat(outs), picked, tuple(finals), what)
