"""The fp32 DeepSeek-V3.2 reference on the CPU: dense when topk covers every key, the MLA over just the
selected keys otherwise (checked in the up-projected form, by other arithmetic), the indexer's score
formula and its top-k, causality, and the pluggable selection."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from operatorx.backends.torch.attention.dsa import DsaWeights, dsa_weights, mla_args
from operatorx.backends.torch.attention.dsa_reference import (
    dsa_reference,
    index_keys,
    index_scores,
    overlap,
    top_k,
)
from operatorx.backends.torch.attention.layout import Layout, Request, plan_layout
from operatorx.backends.torch.attention.mla import softmax_scale
from operatorx.backends.torch.attention.reference import mla_reference
from operatorx.backends.torch.attention.rope import apply_rope, rope_table
from operatorx.spec.attention import MlaDsaArgs

SIZES = {"hidden": 128, "heads": 4, "q_lora_rank": 64, "kv_lora_rank": 64, "nope": 32, "rope_dim": 16, "v": 32,
         "rope_theta": 10000.0, "index_heads": 8, "index_dim": 32}
YARN = {"type": "yarn", "factor": 40, "original_max": 4096, "mscale": 1.0, "mscale_all_dim": 1.0}
MIXED = [{"count": 3, "q": 1, "ctx": {"dist": "uniform", "min": 20, "max": 90}}, {"count": 1, "q": 40, "ctx": 30},
         {"count": 1, "q": 24, "ctx": 0}]


def _args(topk: int, groups: Any = None, **extra: Any) -> MlaDsaArgs:
    return MlaDsaArgs.model_validate({**SIZES, **extra, "topk": topk,
                                      "batch": {"groups": groups or MIXED, "pages": "shuffled", "seed": 5}})


class Setup:
    """Weights, inputs and per-request cache contents (latents and indexer keys) of a case."""

    def __init__(self, args: MlaDsaArgs, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.args, self.layout = args, plan_layout(args.batch)
        self.w: DsaWeights = dsa_weights(args, gen, "cpu")
        self.x = torch.randn(self.layout.tokens, args.hidden, generator=gen, dtype=torch.bfloat16)
        width = args.kv_lora_rank + args.rope_dim
        self.latents = {r: torch.randn(r.ctx, width, generator=gen) for r in self.layout.requests}
        self.keys = {r: torch.randn(r.ctx, args.index_dim, generator=gen) for r in self.layout.requests}

    def latent(self, r: Request) -> torch.Tensor:
        return self.latents[r]

    def key(self, r: Request) -> torch.Tensor:
        return self.keys[r]

    def run(self, **kw: Any) -> Any:
        return dsa_reference(self.args, self.w, self.x, self.layout, self.latent, self.key, **kw)


def _requests(layout: Layout, rows: torch.Tensor) -> list[Request]:
    return [r for r in layout.requests if bool(((rows >= r.row0) & (rows < r.row0 + r.q)).any())]


def _up_projected(s: Setup, req: Request, offsets: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
    """The MLA rows of `offsets` in the materialized form over only the `picked` positions [n, k] (-1 none):
    K = [kv_b(latent) nope | rope key], V = kv_b(latent) v, an explicit masked softmax."""
    a, mw, r = s.args, s.w.mla, s.args.kv_lora_rank
    x = s.x[req.row0:req.row0 + req.q].float()
    pos = torch.arange(req.ctx, req.ctx + req.q)
    table = rope_table(pos, a.rope_dim, a.rope_theta, a.rope_scaling, "interleaved", torch.float32, "cpu")
    q_lat = F.rms_norm(x @ mw.q_a.float().T, (a.q_lora_rank,), mw.q_a_norm.float(), eps=1e-6)
    q = (q_lat @ mw.q_b.float().T).view(req.q, a.heads, a.nope + a.rope_dim)
    q = torch.cat((q[..., :a.nope], apply_rope(q[..., a.nope:], table)), -1)
    kv_a = x @ mw.kv_a.float().T
    latent = torch.cat((s.latents[req][:, :r], F.rms_norm(kv_a[:, :r], (r,), mw.kv_a_norm.float(), eps=1e-6)))
    k_rope = torch.cat((s.latents[req][:, r:], apply_rope(kv_a[:, None, r:], table)[:, 0]))
    kv = (latent @ mw.kv_b.float().T).view(-1, a.heads, a.nope + a.v)
    outs = []
    for row, sel in zip(offsets.tolist(), picked.tolist(), strict=True):
        keys = torch.tensor(sorted(i for i in sel if i >= 0))
        k = torch.cat((kv[keys, :, :a.nope], k_rope[keys, None, :].expand(-1, a.heads, -1)), -1)
        logits = torch.einsum("hd,lhd->hl", q[row], k) * softmax_scale(mla_args(a))
        mix = torch.einsum("hl,lhv->hv", torch.softmax(logits, -1), kv[keys, :, a.nope:])
        outs.append(mix.reshape(-1) @ mw.o.float().T)
    return torch.stack(outs)


@pytest.mark.parametrize("extra", [{}, {"rope_scaling": YARN}], ids=["plain", "yarn"])
def test_topk_covering_every_key_is_the_dense_mla(extra):
    s = Setup(_args(topk=512, **extra))
    got = s.run()
    dense = mla_reference(mla_args(s.args), s.w.mla, s.x, s.layout, s.latent)
    assert torch.equal(got.rows, dense.rows)
    torch.testing.assert_close(got.out, dense.out, rtol=1e-5, atol=1e-5)
    for idx, req in zip(got.own_indices, _requests(s.layout, got.rows), strict=True):
        assert idx.shape[1] == req.ctx + req.q          # every key selectable, -1 where causal forbids


def test_small_topk_attends_only_the_selected_keys():
    s = Setup(_args(topk=8))
    got = s.run()
    dense = mla_reference(mla_args(s.args), s.w.mla, s.x, s.layout, s.latent)
    assert (got.out - dense.out).norm() > 1e-2 * dense.out.norm()     # the selection changes the output
    start = 0
    for idx, req in zip(got.used_indices, _requests(s.layout, got.rows), strict=True):
        rows = got.rows[start:start + idx.shape[0]]
        want = _up_projected(s, req, rows - req.row0, idx)
        torch.testing.assert_close(got.out[start:start + idx.shape[0]], want, rtol=2e-4, atol=2e-4)
        start += idx.shape[0]
    assert start == got.rows.numel()


def test_index_scores_follow_the_weighted_relu_formula():
    args = _args(topk=4)
    s = Setup(args)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, args.hidden, generator=gen)
    q_lat = torch.randn(3, args.q_lora_rank, generator=gen)
    pos = torch.tensor([4, 6, 9])
    keys = torch.randn(10, args.index_dim, generator=gen)
    got = index_scores(args, s.w, x, q_lat, pos, keys)
    table = rope_table(pos, args.rope_dim, args.rope_theta, None, "neox", torch.float32, "cpu")
    q = (q_lat @ s.w.wq_b.float().T).view(3, args.index_heads, args.index_dim)
    q = torch.cat((apply_rope(q[..., :args.rope_dim], table), q[..., args.rope_dim:]), -1)
    head_w = x @ s.w.weights_proj.float().T
    for n in range(3):
        for j in range(10):
            if j > pos[n]:
                assert got[n, j] == -math.inf
                continue
            want = sum(float(head_w[n, h]) * max(float(q[n, h] @ keys[j]), 0.0) for h in range(args.index_heads))
            want *= args.index_dim ** -0.5 * args.index_heads ** -0.5
            assert abs(float(got[n, j]) - want) < 1e-4 * (1 + abs(want))


def test_index_scores_stay_fp32_under_a_bf16_default_dtype():
    """The check runs inside the build's case scope, whose default dtype is the model's bf16."""
    args = _args(topk=4)
    s = Setup(args)
    gen = torch.Generator().manual_seed(2)
    x, q_lat = torch.randn(2, args.hidden, generator=gen), torch.randn(2, args.q_lora_rank, generator=gen)
    pos, keys = torch.tensor([3, 7]), torch.randn(8, args.index_dim, generator=gen)
    want = index_scores(args, s.w, x, q_lat, pos, keys)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        got = index_scores(args, s.w, x, q_lat, pos, keys)
    finally:
        torch.set_default_dtype(before)
    assert got.dtype == torch.float32 and torch.equal(got, want)


def test_top_k_picks_the_planted_highest_scores():
    scores = torch.tensor([[0.1, 5.0, -2.0, 3.0, 4.0, -math.inf], [1.0, -math.inf, -math.inf, -math.inf, 2.0, 0.5]])
    assert [sorted(r) for r in top_k(scores, 3).tolist()] == [[1, 3, 4], [0, 4, 5]]
    assert sorted(top_k(scores, 5)[1].tolist()) == [-1, -1, 0, 4, 5]    # fewer allowed keys than topk: all


def test_planted_cached_keys_are_selected_by_their_strength():
    """Cached keys c_l · u with positive head weights: every score is c_l · (a positive sum), so the top-k
    of the cached keys are the largest c_l."""
    args = _args(topk=6, groups=[{"count": 1, "q": 1, "ctx": 40}])
    s = Setup(args)
    req = s.layout.requests[0]
    s.w.weights_proj = s.x[0:1].repeat(args.index_heads, 1)            # w_h = |x|² > 0 for every head
    strength = torch.randperm(40, generator=torch.Generator().manual_seed(2)).float() + 1
    s.keys[req] = strength[:, None] * torch.randn(args.index_dim, generator=torch.Generator().manual_seed(3))
    got = s.run().own_indices[0][0].tolist()
    cached_picks = sorted(i for i in got if i < req.ctx)
    strongest = sorted(torch.argsort(strength, descending=True)[:len(cached_picks)].tolist())
    assert len(cached_picks) >= args.topk - 1 and cached_picks == strongest


def test_a_new_token_never_selects_a_later_one():
    s = Setup(_args(topk=4, groups=[{"count": 1, "q": 20, "ctx": 0}, {"count": 1, "q": 12, "ctx": 9}]))
    got = s.run()
    for idx, req in zip(got.own_indices, _requests(s.layout, got.rows), strict=True):
        for i, row in enumerate(idx.tolist()):
            picked = [j for j in row if j >= 0]
            assert len(picked) == len(set(picked)) == min(req.ctx + i + 1, 4)
            assert max(picked) <= req.ctx + i


def test_given_selection_replaces_the_own_top_k():
    s = Setup(_args(topk=8))
    own = s.run()
    reqs = _requests(s.layout, own.rows)
    by_request = dict(zip(reqs, own.own_indices, strict=True))
    fed = s.run(selection=lambda req, pick: by_request[req])
    assert torch.equal(fed.out, own.out) and fed.invalid_picks == own.invalid_picks == 0
    first = s.run(selection=lambda req, pick: torch.zeros(len(pick), 1, dtype=torch.int64))
    assert not torch.allclose(first.out, own.out, rtol=1e-2, atol=1e-2)
    assert all(torch.equal(a, b) for a, b in zip(first.own_indices, own.own_indices, strict=True))
    late = s.run(selection=lambda req, pick: torch.full((len(pick), 1), req.ctx + req.q - 1, dtype=torch.int64))
    assert late.invalid_picks == sum(len(i) - 1 for i in own.own_indices)   # every row but each request's last


def test_overlap_counts_shared_picks():
    own = torch.tensor([[0, 1, 2, -1], [3, 4, 5, 6]])
    other = torch.tensor([[2, 1, 7, -1], [6, 5, 4, 3]])
    assert overlap(own, other) == pytest.approx(6 / 7)
    assert overlap(own, own) == 1.0


def test_index_keys_are_normed_then_rotated():
    args = _args(topk=4)
    s = Setup(args)
    x = torch.randn(5, args.hidden, generator=torch.Generator().manual_seed(4))
    pos = torch.arange(3, 8)
    k = index_keys(args, s.w, x, pos)
    normed = F.layer_norm(x @ s.w.wk.float().T, (args.index_dim,), s.w.k_norm.float(), s.w.k_norm_bias.float(),
                          eps=1e-6)
    torch.testing.assert_close(k[:, args.rope_dim:], normed[:, args.rope_dim:])
    table = rope_table(pos, args.rope_dim, args.rope_theta, None, "neox", torch.float32, "cpu")
    torch.testing.assert_close(k[:, :args.rope_dim], apply_rope(normed[:, None, :args.rope_dim], table)[:, 0])
    assert not torch.allclose(k[:, :args.rope_dim], normed[:, :args.rope_dim])


def test_a_reuse_layer_attends_the_given_selection_without_an_indexer():
    """`indexer: reuse`: the same MLA over the given picks as an own-indexer layer fed those picks, and no
    indexer key is read (an earlier layer chose them)."""
    own_args = _args(topk=8)
    s = Setup(own_args)
    own = s.run()
    by_request = dict(zip(_requests(s.layout, own.rows), own.own_indices, strict=True))
    reuse = Setup(_args(topk=8, indexer="reuse"))
    got = dsa_reference(reuse.args, s.w, s.x, s.layout, s.latent, None,
                        selection=lambda req, pick: by_request[req])
    torch.testing.assert_close(got.out, own.out, rtol=0, atol=0)
    assert all(torch.equal(a, b) for a, b in zip(got.own_indices, own.own_indices, strict=True))
    assert "no indexer (reuse" in got.what
    with pytest.raises(ValueError, match="given selection"):
        dsa_reference(reuse.args, s.w, s.x, s.layout, s.latent, None)
    with pytest.raises(ValueError, match="cached_keys"):
        dsa_reference(own_args, s.w, s.x, s.layout, s.latent, None)
