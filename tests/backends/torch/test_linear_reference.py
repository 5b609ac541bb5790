"""The fp32 linear-attention reference (gdn, kda) against an independent naive loop, and its state semantics."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from operatorx.backends.torch.attention.layout import plan_layout
from operatorx.backends.torch.attention.linear_reference import (
    causal_conv,
    gdn_request,
    kda_request,
    linear_reference,
    zero_state,
)
from operatorx.backends.torch.attention.linear_weights import (
    GdnWeights,
    RequestState,
    conv_channels,
    linear_weights,
    random_states,
)
from operatorx.spec import Case
from operatorx.spec.attention import GdnArgs, KdaArgs


def _gdn(groups: list[dict[str, int]], **kw: object) -> GdnArgs:
    args = {"hidden": 24, "qk_heads": 2, "v_heads": 4, "head_dim": 8, "conv_kernel": 4, "batch": {"groups": groups}}
    c = Case.model_validate({"type": "gdn", "args": {**args, **kw}})
    assert isinstance(c.args, GdnArgs)
    return c.args


def _kda(groups: list[dict[str, int]]) -> KdaArgs:
    c = Case.model_validate({"type": "kda", "args": {"hidden": 24, "heads": 3, "head_dim": 8, "conv_kernel": 3,
                                                     "batch": {"groups": groups}}})
    assert isinstance(c.args, KdaArgs)
    return c.args


def _setup(args: GdnArgs | KdaArgs, tokens: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    w = linear_weights(args, gen, "cpu")
    x = torch.randn(tokens, args.hidden, generator=gen)
    conv, ssm = random_states(args, 1, gen, "cpu")
    return w, x, RequestState(conv[0].float(), ssm[0].float())


def _naive_gdn(args: GdnArgs, w: GdnWeights, x: torch.Tensor, s: RequestState) -> tuple[torch.Tensor, torch.Tensor]:
    """Written apart from the module: explicit history for the conv, a [K, V] state per head, scalar gates."""
    d, kd, hq, hv = args.head_dim, args.qk_heads * args.head_dim, args.qk_heads, args.v_heads
    wf = {k: getattr(w, k).float() for k in ("qkv", "z", "b", "a", "conv", "dt_bias", "A_log", "norm", "out")}
    history = [s.conv[:, j].clone() for j in range(args.conv_kernel - 1)]
    states = [s.ssm[h].t().clone() for h in range(hv)]                 # S[k, v]
    outs = []
    for t in range(x.shape[0]):
        u = wf["qkv"] @ x[t]
        history.append(u)
        window = history[-args.conv_kernel:]
        y = torch.stack([sum(wf["conv"][c, j] * window[j][c] for j in range(args.conv_kernel))
                         for c in range(u.numel())])
        y = y * torch.sigmoid(y)
        heads_o = []
        for h in range(hv):
            qh = y[(h // (hv // hq)) * d:(h // (hv // hq) + 1) * d]
            kh = y[kd + (h // (hv // hq)) * d:kd + (h // (hv // hq) + 1) * d]
            vh = y[2 * kd + h * d:2 * kd + (h + 1) * d]
            qh, kh = qh / math.sqrt(float(qh @ qh) + 1e-6) / math.sqrt(d), kh / math.sqrt(float(kh @ kh) + 1e-6)
            pre = float(wf["a"][h] @ x[t] + wf["dt_bias"][h])
            decay = math.exp(-math.exp(float(wf["A_log"][h])) * math.log1p(math.exp(pre)))
            beta = 1 / (1 + math.exp(-float(wf["b"][h] @ x[t])))
            S = states[h] * decay
            S = S + beta * torch.outer(kh, vh - S.t() @ kh)
            states[h] = S
            o = S.t() @ qh
            z = wf["z"][h * d:(h + 1) * d] @ x[t]
            o = o / math.sqrt(float((o * o).mean()) + 1e-6) * wf["norm"] * (z * torch.sigmoid(z))
            heads_o.append(o)
        outs.append(wf["out"] @ torch.cat(heads_o))
    return torch.stack(outs), torch.stack([S.t() for S in states])


def test_gdn_reference_matches_a_naive_per_token_loop():
    args = _gdn([{"count": 1, "q": 5, "ctx": 3}])
    w, x, s = _setup(args, 5)
    out, final = gdn_request(args, w, x, s)
    naive_out, naive_ssm = _naive_gdn(args, w, x, s)
    torch.testing.assert_close(out, naive_out, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(final.ssm, naive_ssm, rtol=1e-4, atol=1e-5)


def test_kda_decays_each_key_channel_and_gates_with_a_sigmoid():
    args = _kda([{"count": 1, "q": 1, "ctx": 2}])
    w, x, s = _setup(args, 1)
    out, final = kda_request(args, w, x, s)
    d, p = args.head_dim, args.heads * args.head_dim
    wf = {k: getattr(w, k).float() for k in w.__dataclass_fields__}
    ys = []
    for i, name in enumerate(("q", "k", "v")):
        window = torch.cat([s.conv[i * p:(i + 1) * p], (wf[name] @ x[0])[:, None]], dim=1)
        ys.append(F.silu((window * wf[f"{name}_conv"]).sum(1)).reshape(args.heads, d))
    q = ys[0] / (ys[0].pow(2).sum(-1, keepdim=True) + 1e-6).sqrt() / math.sqrt(d)
    k = ys[1] / (ys[1].pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    raw = (wf["f_b"] @ (wf["f_a"] @ x[0]) + wf["dt_bias"]).reshape(args.heads, d)
    decay = torch.exp(-wf["A_log"].exp()[:, None] * F.softplus(raw))            # [heads, d_k]
    beta = torch.sigmoid(wf["b"] @ x[0])
    S = s.ssm * decay[:, None, :]
    S = S + beta[:, None, None] * (ys[2] - torch.einsum("hvk,hk->hv", S, k))[:, :, None] * k[:, None, :]
    o = torch.einsum("hvk,hk->hv", S, q)
    gate = (wf["g_b"] @ (wf["g_a"] @ x[0])).reshape(args.heads, d)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * wf["o_norm"] * torch.sigmoid(gate)
    torch.testing.assert_close(out[0], wf["o"] @ o.reshape(-1), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(final.ssm, S, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("split", [1, 3, 6])
def test_running_the_tokens_in_two_calls_carrying_the_state_is_one_call(kind, split):
    args = _gdn([{"count": 1, "q": 7, "ctx": 4}]) if kind == "gdn" else _kda([{"count": 1, "q": 7, "ctx": 4}])
    run = gdn_request if kind == "gdn" else kda_request
    w, x, s = _setup(args, 7, seed=split)
    whole, final = run(args, w, x, s)  # type: ignore[arg-type]
    first, mid = run(args, w, x[:split], s)  # type: ignore[arg-type]
    second, end = run(args, w, x[split:], mid)  # type: ignore[arg-type]
    torch.testing.assert_close(torch.cat([first, second]), whole, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(end.ssm, final.ssm, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(end.conv, final.conv)


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_decode_steps_are_the_prefill_of_their_tokens(kind):
    args = _gdn([{"count": 1, "q": 4, "ctx": 1}]) if kind == "gdn" else _kda([{"count": 1, "q": 4, "ctx": 1}])
    run = gdn_request if kind == "gdn" else kda_request
    w, x, s = _setup(args, 4, seed=7)
    whole, _ = run(args, w, x, s)  # type: ignore[arg-type]
    state, steps = s, []
    for t in range(4):
        out, state = run(args, w, x[t:t + 1], state)  # type: ignore[arg-type]
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps), whole, rtol=1e-5, atol=1e-6)


def test_the_conv_state_is_the_inputs_before_the_first_new_token_newest_last():
    gen = torch.Generator().manual_seed(3)
    u, w = torch.randn(5, 6, generator=gen), torch.randn(6, 4, generator=gen)
    state = torch.randn(6, 3, generator=gen)
    y, new = causal_conv(u, w, state)
    history = torch.cat([state, u.t()], dim=1)                                  # [C, 3 + 5], oldest first
    want = torch.stack([F.silu((history[:, t:t + 4] * w).sum(1)) for t in range(5)])
    torch.testing.assert_close(y, want)
    torch.testing.assert_close(new, u[-3:].t())
    zero_y, _ = causal_conv(u, w, torch.zeros(6, 3))
    padded = torch.cat([torch.zeros(6, 3), u.t()], dim=1)
    torch.testing.assert_close(zero_y[0], F.silu((padded[:, :4] * w).sum(1)))


def test_the_gdn_conv_state_after_a_call_holds_the_last_projected_inputs():
    args = _gdn([{"count": 1, "q": 6, "ctx": 2}])
    w, x, s = _setup(args, 6)
    _, final = gdn_request(args, w, x, s)
    torch.testing.assert_close(final.conv, (x[-3:] @ w.qkv.float().t()).t())


def test_a_request_without_context_starts_from_zeros_and_the_rows_are_its_tokens():
    args = _gdn([{"count": 3, "q": 1, "ctx": 5}, {"count": 1, "q": 4, "ctx": 0}], norm_act="sigmoid")
    layout = plan_layout(args.batch)
    w, _, _ = _setup(args, 1)
    x = torch.randn(layout.tokens, args.hidden, generator=torch.Generator().manual_seed(1))
    seen = []

    def state_of(r):
        seen.append(r.row0)
        return RequestState(torch.ones(conv_channels(args), 3), torch.full((4, 8, 8), 0.1))

    ref = linear_reference(args, w, x, layout, state_of)
    assert seen == [0, 2]                                 # first and last decode; the prefill has no state
    assert ref.rows.tolist() == [0, 2, 3, 4, 5, 6]
    want, _ = gdn_request(args, w, x[3:7], zero_state(args, "cpu"))
    torch.testing.assert_close(ref.out[2:], want)
    other = linear_reference(args, w, x, layout, lambda r: zero_state(args, "cpu"))
    assert not torch.allclose(ref.out[:2], other.out[:2])      # the decodes read the state they are given
