"""The fp32 DeepSeek-V4 attention reference on the CPU at small sizes: a window-only layer against a naive
computation (complex-number RoPE, the sink as a sigmoid of lse - sink, a per-group loop for wo_a), a planted
selection of compressed entries, causality, the sink, the compressor's boundary pooling by hand, the fp8
stores, and the weights' FP8 exactness."""

from __future__ import annotations

import math
from typing import Any, Optional

import pytest
import torch

from operatorx.backends.torch.attention.dsv4 import (
    DSV4_NORM_EPS,
    FP8_BLOCK,
    CompressorWeights,
    Dsv4Weights,
    block_fp8,
    compressor_coff,
    dsv4_weights,
)
from operatorx.backends.torch.attention.dsv4_reference import (
    Dsv4Cached,
    compress_entries,
    compressor_states,
    ds_mla_round_trip,
    dsv4_reference,
    index_fp8_round_trip,
    index_q_round_trip,
    rope_last,
)
from operatorx.backends.torch.attention.layout import Request, plan_layout
from operatorx.spec.attention import Dsv4AttnArgs

SIZES = {"hidden": 128, "heads": 4, "head_dim": 64, "rope_dim": 16, "q_lora_rank": 64, "window": 8, "o_groups": 2,
         "o_lora_rank": 32, "rope_theta": 10000.0}
DECODE_PREFILL = [{"count": 3, "q": 1, "ctx": {"dist": "uniform", "min": 3, "max": 40}},
                  {"count": 1, "q": 13, "ctx": 6}, {"count": 1, "q": 11, "ctx": 0}]


def _args(ratio: int, groups: Any = None, **extra: Any) -> Dsv4AttnArgs:
    fields: dict[str, Any] = {**SIZES, "compress_ratio": ratio, **extra,
                              "batch": {"groups": groups or DECODE_PREFILL, "pages": "shuffled", "seed": 3}}
    if ratio:
        fields.setdefault("compress_rope_theta", 160000.0)
    if ratio == 4:
        fields.update(indexer="own", topk=fields.get("topk", 4), index_heads=4, index_dim=32)
    return Dsv4AttnArgs.model_validate(fields)


class Setup:
    """Weights, inputs and per-request cache contents of a case (random fp32 rows as the caches hold them)."""

    def __init__(self, args: Dsv4AttnArgs, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.args, self.layout = args, plan_layout(args.batch)
        self.w: Dsv4Weights = dsv4_weights(args, gen, "cpu")
        self.x = torch.randn(self.layout.tokens, args.hidden, generator=gen, dtype=torch.bfloat16)
        r, hd = args.compress_ratio, args.head_dim
        coff = compressor_coff(r)

        self.window = {q: torch.randn(min(q.ctx, args.window - 1), hd, generator=gen) for q in self.layout.requests}
        self.compressed = {q: torch.randn(q.ctx // r, hd, generator=gen) for q in self.layout.requests} if r else {}
        self.state = {q: torch.randn(min(q.ctx, coff * r - 1), 2 * coff * hd, generator=gen)
                      for q in self.layout.requests} if r else {}
        idim = args.index_dim or 0
        self.index_keys = {q: torch.randn(q.ctx // 4, idim, generator=gen) for q in self.layout.requests}
        self.index_state = {q: torch.randn(min(q.ctx, 7), 4 * idim, generator=gen) for q in self.layout.requests}

    def cached(self) -> Dsv4Cached:
        r = self.args.compress_ratio
        return Dsv4Cached(window=lambda q: self.window[q],
                          compressed=(lambda q: self.compressed[q]) if r else None,
                          state=(lambda q: self.state[q]) if r else None,
                          index_keys=(lambda q: self.index_keys[q]) if r == 4 else None,
                          index_state=(lambda q: self.index_state[q]) if r == 4 else None)

    def run(self, **kw: Any) -> Any:
        return dsv4_reference(self.args, self.w, self.x, self.layout, self.cached(), **kw)


# ---- a naive computation, by other arithmetic ---------------------------------------------------------------

def _rms(x: torch.Tensor, weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + DSV4_NORM_EPS)
    return y if weight is None else y * weight.float()


def _complex_rope(x: torch.Tensor, pos: torch.Tensor, rope: int, theta: float, sign: float = 1.0) -> torch.Tensor:
    """Plain RoPE by complex multiplication on the last `rope` dims (pairs 2i, 2i + 1 as re, im)."""
    freq = theta ** (-torch.arange(0, rope, 2, dtype=torch.float64) / rope)
    turn = torch.polar(torch.ones(len(pos), rope // 2, dtype=torch.float64),
                       sign * pos.double()[:, None] * freq[None, :])
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (rope // 2,)
    z = torch.view_as_complex(x[..., -rope:].double().reshape(*x.shape[:-1], rope // 2, 2).contiguous())
    rotated = torch.view_as_real(z * turn.view(shape)).reshape(*x.shape[:-1], rope).float()
    return torch.cat((x[..., :-rope], rotated), -1)


def _naive_rows(s: Setup, req: Request, extra: list[torch.Tensor], theta: float) -> torch.Tensor:
    """Every new row of `req`: its window keys plus the given extra (compressed) keys [k, hd] per row."""
    a, w = s.args, s.w
    x = s.x[req.row0:req.row0 + req.q].float()
    pos = torch.arange(req.ctx, req.ctx + req.q)
    qr = _rms(x @ w.wq_a.float().T, w.q_norm)
    kv = _complex_rope(_rms(x @ w.wkv.float().T, w.kv_norm), pos, a.rope_dim, theta)
    q = _complex_rope(_rms((qr @ w.wq_b.float().T).view(req.q, a.heads, a.head_dim)), pos, a.rope_dim, theta)
    lat = torch.cat((s.window[req], kv))
    lat_pos = torch.arange(req.ctx - s.window[req].shape[0], req.ctx + req.q)
    outs = []
    for i in range(req.q):
        p = req.ctx + i
        keys = torch.cat((lat[(lat_pos <= p) & (lat_pos > p - a.window)], extra[i]))
        heads = []
        for h in range(a.heads):
            logits = keys @ q[i, h] / math.sqrt(a.head_dim)
            lse = torch.logsumexp(logits, 0)
            keep = torch.sigmoid(lse - w.attn_sink[h].float())      # exp(lse) / (exp(lse) + exp(sink))
            heads.append(torch.softmax(logits, 0) @ keys * keep)
        o = _complex_rope(torch.stack(heads)[None], pos[i:i + 1], a.rope_dim, theta, sign=-1.0)[0]
        hpg = a.heads // a.o_groups
        z = []
        for g in range(a.o_groups):
            w_g = w.wo_a.float()[g * a.o_lora_rank:(g + 1) * a.o_lora_rank]
            z.append(w_g @ o[g * hpg:(g + 1) * hpg].reshape(-1))
        outs.append(torch.cat(z) @ w.wo_b.float().T)
    return torch.stack(outs)


def _split(got: Any, s: Setup) -> list[tuple[Request, torch.Tensor]]:
    """(request, its reference rows' outputs) in order (every row: q <= REF_TOKENS here)."""
    out, start = [], 0
    for req in s.layout.requests:
        if bool(((got.rows >= req.row0) & (got.rows < req.row0 + req.q)).any()):
            out.append((req, got.out[start:start + req.q]))
            assert torch.equal(got.rows[start:start + req.q], torch.arange(req.row0, req.row0 + req.q))
            start += req.q
    assert start == got.rows.numel()
    return out


# ---- tests ---------------------------------------------------------------------------------------------------

def test_window_only_layer_is_the_naive_computation():
    s = Setup(_args(0))
    got = s.run(quantized=False)
    checked = _split(got, s)
    assert len(checked) == 4                      # the first and last of group 0, group 1's and group 2's
    for req, out in checked:
        want = _naive_rows(s, req, [torch.zeros(0, s.args.head_dim)] * req.q, s.args.rope_theta)
        torch.testing.assert_close(out, want, rtol=2e-4, atol=2e-4)
    assert got.own_indices == [] and "window only" in got.what


def test_window_rows_beyond_the_window_are_not_read():
    s = Setup(_args(0, groups=[{"count": 1, "q": 1, "ctx": 30}]))
    base = s.run(quantized=False).out
    req = s.layout.requests[0]
    s.window[req] = torch.cat((1e3 * torch.randn(5, s.args.head_dim), s.window[req]))  # older rows, before them
    torch.testing.assert_close(s.run(quantized=False).out, base, rtol=0, atol=0)
    s.window[req][-1] += 1.0                                                              # the newest cached row
    assert not torch.allclose(s.run(quantized=False).out, base)


DECODES = [{"count": 2, "q": 1, "ctx": 41}, {"count": 1, "q": 1, "ctx": 30}]   # no boundary: (ctx + 1) % 4 != 0


def test_planted_selection_attends_exactly_those_entries():
    s = Setup(_args(4, groups=DECODES))
    plant = {0: [3, 7, -1, 1], 1: [6, -1, 0, -1]}                     # ctx 41: 10 entries, ctx 30: 7

    def select(req: Request, offsets: torch.Tensor) -> torch.Tensor:
        return torch.tensor([plant[req.group]], dtype=torch.int64)

    got = s.run(selection=select, quantized=False)
    assert got.invalid_picks == 0
    theta = s.args.compress_rope_theta
    assert theta is not None
    for req, out in _split(got, s):
        keys = [i for i in plant[req.group] if i >= 0]
        want = _naive_rows(s, req, [s.compressed[req][keys]], theta)
        torch.testing.assert_close(out, want, rtol=2e-4, atol=2e-4)
    # an unselected entry is never read; a selected one is
    first = s.layout.requests[0]
    s.compressed[first][5] += 100.0
    torch.testing.assert_close(s.run(selection=select, quantized=False).out, got.out, rtol=0, atol=0)
    s.compressed[first][3] += 1.0
    assert not torch.allclose(s.run(selection=select, quantized=False).out, got.out)


def test_own_top_k_is_the_highest_indexer_scores():
    s = Setup(_args(4, groups=DECODES, topk=3))
    got = s.run(quantized=False)
    a, iw = s.args, s.w.indexer
    assert iw is not None and a.index_heads is not None and a.index_dim is not None
    theta = a.compress_rope_theta
    assert theta is not None
    for (req, _), own in zip(_split(got, s), got.own_indices, strict=True):
        x = s.x[req.row0:req.row0 + 1].float()
        qr = _rms(x @ s.w.wq_a.float().T, s.w.q_norm)
        q = _complex_rope((qr @ iw.wq_b.float().T).view(1, a.index_heads, a.index_dim), torch.tensor([req.ctx]),
                          a.rope_dim, theta)
        head_w = (x @ iw.weights_proj.float().T)[0]
        keys = s.index_keys[req]
        scores = torch.stack([sum(head_w[h] * torch.relu(q[0, h] @ keys[j]) for h in range(a.index_heads))
                              for j in range(keys.shape[0])])
        want = set(torch.topk(scores, 3).indices.tolist())
        assert set(own[0].tolist()) == want
    assert all(torch.equal(o, u) for o, u in zip(got.own_indices, got.used_indices, strict=True))


@pytest.mark.parametrize("ratio", [4, 128])
def test_no_row_reads_a_later_token(ratio):
    groups = [{"count": 1, "q": 13, "ctx": 6}] if ratio == 4 else [{"count": 1, "q": 20, "ctx": 250}]
    s = Setup(_args(ratio, groups=groups))
    base = s.run().out
    cut = 5                                                 # rows after it change: rows up to it must not
    s.x[cut + 1:] = torch.randn(s.x.shape[0] - cut - 1, s.args.hidden).to(torch.bfloat16)
    out = s.run().out
    torch.testing.assert_close(out[:cut + 1], base[:cut + 1], rtol=1e-6, atol=1e-6)
    assert not torch.allclose(out[cut + 1:], base[cut + 1:])


def test_given_entries_after_the_token_are_masked_and_counted():
    s = Setup(_args(4, groups=[{"count": 1, "q": 13, "ctx": 6}]))
    every = torch.arange((6 + 13) // 4)                     # all 4 entries, the last ones future for early rows

    def select_all(req: Request, offsets: torch.Tensor) -> torch.Tensor:
        return every.expand(len(offsets), -1).clone()

    def select_causal(req: Request, offsets: torch.Tensor) -> torch.Tensor:
        limit = ((req.ctx + offsets + 1) // 4)[:, None]
        return torch.where(every[None, :] < limit, every[None, :], -1)

    all_ = s.run(selection=select_all)
    causal = s.run(selection=select_causal)
    torch.testing.assert_close(all_.out, causal.out, rtol=0, atol=0)
    limits = (6 + torch.arange(13) + 1) // 4
    assert all_.invalid_picks == int((4 - limits).sum()) > 0 and causal.invalid_picks == 0
    for own in all_.own_indices:                            # the reference's own picks are causal too
        assert bool(((own < limits[:, None]) | (own < 0)).all())


def test_huge_sink_drives_the_output_to_zero_and_minus_inf_is_no_sink():
    s = Setup(_args(128, groups=[{"count": 1, "q": 3, "ctx": 300}]))
    s.w.attn_sink = torch.full((s.args.heads,), 1e4)
    assert float(s.run().out.abs().max()) < 1e-6
    s.w.attn_sink = torch.full((s.args.heads,), -math.inf)
    none = s.run(quantized=False)
    req = s.layout.requests[0]
    want = _naive_rows(s, req, [s.compressed[req][:2]] * 3, 160000.0)     # entries < (p + 1) // 128 = 2
    torch.testing.assert_close(none.out, want, rtol=2e-4, atol=2e-4)
    s.w.attn_sink = torch.zeros(s.args.heads)
    zero = s.run(quantized=False)
    ratio = zero.out.norm(dim=-1) / none.out.norm(dim=-1)
    assert bool((ratio < 0.999).all())                                     # a sink of 0 takes some weight


def test_ratio_128_decode_at_a_boundary_attends_the_entry_it_writes():
    s = Setup(_args(128, groups=[{"count": 1, "q": 1, "ctx": 383}]))   # p = 383: (p + 1) % 128 == 0
    base = s.run(quantized=False).out
    req = s.layout.requests[0]
    s.state[req][0, 0] += 5.0                                           # position 256: inside entry 2's pool
    assert not torch.allclose(s.run(quantized=False).out, base)
    s2 = Setup(_args(128, groups=[{"count": 1, "q": 1, "ctx": 382}]))  # no boundary: the state is not read
    base2 = s2.run(quantized=False).out
    s2.state[s2.layout.requests[0]] += 5.0
    torch.testing.assert_close(s2.run(quantized=False).out, base2, rtol=0, atol=0)


def _hand_entry(cw: CompressorWeights, states: torch.Tensor, first: int, p: int, rope: int, theta: float):
    r, head, coff = cw.ratio, cw.head, cw.coff
    pooled = torch.zeros(head)
    for c in range(head):
        kvs, scores = [], []
        for t in range(p - coff * r + 1, p + 1):
            if t < 0:
                continue
            half = 0 if (coff == 2 and t <= p - r) else coff - 1
            kvs.append(float(states[t - first, half * head + c]))
            scores.append(float(states[t - first, coff * head + half * head + c]))
        m = max(scores)
        e = [math.exp(v - m) for v in scores]
        pooled[c] = sum(k * v / sum(e) for k, v in zip(kvs, e, strict=True))
    normed = _rms(pooled[None], cw.norm)
    return _complex_rope(normed, torch.tensor([(p // r) * r]), rope, theta)[0]


@pytest.mark.parametrize("ratio", [4, 128])
def test_compressor_boundary_pooling_by_hand(ratio):
    gen = torch.Generator().manual_seed(7)
    head, rope, hidden, coff = 16, 8, 24, compressor_coff(ratio)
    cw = CompressorWeights(torch.randn(coff * head, hidden, generator=gen).bfloat16(),
                           torch.randn(coff * head, hidden, generator=gen).bfloat16(),
                           torch.randn(ratio, coff * head, generator=gen),
                           (1 + 0.1 * torch.randn(head, generator=gen)).bfloat16())
    x = torch.randn(3 * ratio, hidden, generator=gen).bfloat16()
    pos = torch.arange(3 * ratio)
    states = compressor_states(cw, x, pos)
    kv = x.float() @ cw.wkv.float().T
    assert torch.allclose(states[:, :coff * head], kv)
    score = x.float() @ cw.wgate.float().T
    assert torch.allclose(states[5, coff * head:], score[5] + cw.ape[5 % ratio], atol=1e-5)
    boundaries = torch.tensor([ratio - 1, 2 * ratio - 1, 3 * ratio - 1])
    got = compress_entries(cw, states, 0, boundaries, rope, 1e4, None)
    for row, p in enumerate(boundaries.tolist()):
        torch.testing.assert_close(got[row], _hand_entry(cw, states, 0, p, rope, 1e4), rtol=1e-4, atol=1e-4)
    first = 3 * ratio - coff * ratio
    late = states[first:]                                              # only the rows the last entry needs...
    torch.testing.assert_close(compress_entries(cw, late, first, boundaries[2:], rope, 1e4, None), got[2:])
    with pytest.raises(ValueError, match="compressor state"):         # ...and one fewer is refused
        compress_entries(cw, late[1:], first + 1, boundaries[2:], rope, 1e4, None)


def test_step_writes_entries_at_the_boundaries_it_crosses():
    s = Setup(_args(4, groups=[{"count": 1, "q": 13, "ctx": 6}]))      # positions 6 .. 18: 7, 11, 15 write 1 .. 3

    def select(entry: int) -> Any:
        return lambda req, offsets: torch.full((len(offsets), 1), entry)

    none = s.run(selection=select(-1)).out
    third = s.run(selection=select(3))
    assert third.invalid_picks == 9                                      # positions 6 .. 14: entry 3 is after them
    torch.testing.assert_close(third.out[:9], none[:9], rtol=0, atol=0)
    assert not torch.allclose(third.out[9:], none[9:])                   # 15 .. 18 attend the entry 15 wrote
    assert s.run(selection=select(4)).invalid_picks == 13               # entry 4 is never written (19 // 4)
    s.compressed[s.layout.requests[0]] = torch.randn(2, s.args.head_dim)
    with pytest.raises(ValueError, match="cached.compressed: 2 entries for ctx 6"):
        s.run()


def test_fp8_round_trips():
    gen = torch.Generator().manual_seed(2)
    rows = torch.randn(5, 64, generator=gen) * torch.tensor([1e-3, 1.0, 10.0, 100.0, 0.5])[:, None]
    back = ds_mla_round_trip(rows, 16)
    assert torch.equal(back[:, 48:], rows[:, 48:].bfloat16().float())            # rope part: bf16
    nope = rows[:, :48].bfloat16().float()
    scale = torch.exp2(torch.ceil(torch.log2(nope.abs().amax(-1, keepdim=True) / 448)))
    assert bool(((back[:, :48] - nope).abs() <= scale * 16 + 1e-12).all())       # e4m3: 3 mantissa bits
    assert bool(((back[:, :48] - nope).abs() <= nope.abs() / 8 + scale).all())
    assert torch.equal(ds_mla_round_trip(back, 16), back)                         # stored values are fixed points
    keys = torch.randn(4, 32, generator=gen)
    kb = index_fp8_round_trip(keys)
    assert torch.equal(index_fp8_round_trip(kb), kb) and not torch.equal(kb, keys)
    assert float((kb - keys).abs().max()) < 0.1 * float(keys.abs().max())
    q = torch.randn(3, 2, 32, generator=gen) * torch.tensor([1.0, 1e3])[None, :, None]   # one scale per head
    qb = index_q_round_trip(q)
    assert torch.equal(qb[:, 0], index_fp8_round_trip(q[:, 0])) and torch.equal(qb[:, 1], index_fp8_round_trip(q[:, 1]))


def test_quantized_stores_move_the_output_a_little():
    s = Setup(_args(4))
    exact, stored = s.run(quantized=False).out, s.run().out
    diff = float((exact - stored).norm() / exact.norm())
    assert 0 < diff < 0.1


def test_rope_last_inverse_undoes_it_and_yarn_changes_it():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(6, 3, 32, generator=gen)
    pos = torch.tensor([0, 1, 7, 100, 5000, 65000])
    turned = rope_last(x, pos, 16, 1e4, None)
    assert torch.equal(turned[..., :16], x[..., :16]) and torch.equal(turned[0], x[0])
    torch.testing.assert_close(rope_last(turned, pos, 16, 1e4, None, inverse=True), x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(turned, _complex_rope(x, pos, 16, 1e4), rtol=1e-4, atol=1e-4)
    scaled = _args(4, rope_scaling={"type": "yarn", "factor": 16, "original_max": 4096}).rope_scaling
    assert not torch.allclose(rope_last(x, pos, 16, 1e4, scaled), turned)


@pytest.mark.parametrize("ratio", [0, 4, 128])
def test_weights_shapes_and_fp8_exactness(ratio):
    args = _args(ratio)
    w = dsv4_weights(args, torch.Generator().manual_seed(0), "cpu")
    hd, heads, g, ol = args.head_dim, args.heads, args.o_groups, args.o_lora_rank
    assert w.wo_a.shape == (g * ol, heads * hd // g) and w.wo_b.shape == (args.hidden, g * ol)
    assert w.attn_sink.dtype == torch.float32 and w.attn_sink.shape == (heads,)
    fp8 = [w.wq_a, w.wkv, w.wq_b, w.wo_a, w.wo_b] + ([w.indexer.wq_b] if w.indexer is not None else [])
    for t in fp8:
        q, sc = block_fp8(t)
        full = sc.repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)[:t.shape[0], :t.shape[1]]
        assert torch.equal(q.float() * full, t.float())
    assert (w.compressor is None) == (ratio == 0) and (w.indexer is None) == (ratio != 4)
    if w.compressor is not None:
        coff = compressor_coff(ratio)
        assert w.compressor.ape.shape == (ratio, coff * hd) and w.compressor.ape.dtype == torch.float32
        assert w.compressor.wkv.shape == (coff * hd, args.hidden) and w.compressor.coff == coff
    if w.indexer is not None:
        assert w.indexer.compressor.head == args.index_dim and w.indexer.compressor.coff == 2
    assert len(w.tensors()) == 8 + 4 * (w.compressor is not None) + 6 * (w.indexer is not None)
