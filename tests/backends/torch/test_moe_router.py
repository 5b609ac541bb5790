"""Router math against hand computations (CPU)."""

from __future__ import annotations

import math

import pytest
import torch

from operatorx.backends.torch.moe.activation import apply_activation
from operatorx.backends.torch.moe.router import RouterWeights, TorchRouter, finish_weights, score, select_grouped
from operatorx.spec.moe import Activation, Router


def test_scores_by_hand() -> None:
    logits = torch.tensor([[0.0, 1.0, -2.0]])
    e = [math.exp(v) for v in (0.0, 1.0, -2.0)]
    assert score(logits, "softmax").tolist()[0] == pytest.approx([v / sum(e) for v in e], rel=1e-6)
    assert score(logits, "sigmoid").tolist()[0] == pytest.approx([1 / (1 + math.exp(-v)) for v in (0, 1, -2)])
    want = [math.sqrt(math.log1p(math.exp(v))) for v in (0.0, 1.0, -2.0)]
    assert score(logits, "sqrtsoftplus").tolist()[0] == pytest.approx(want, rel=1e-6)


def test_grouped_topk_by_hand() -> None:
    # 8 experts in 4 groups of 2; keep 2 groups, pick 2 experts.
    choice = torch.tensor([[0.9, 0.0,   0.5, 0.45,   0.1, 0.2,   0.6, 0.0]])
    # unbiased: group score = max → groups 0 (0.9) and 3 (0.6) → experts 0, 6
    assert sorted(select_grouped(choice, 2, 4, 2, biased=False).tolist()[0]) == [0, 6]
    # biased: group score = sum of the best two → group 0 0.9, group 1 0.95 → experts 0, 2
    assert sorted(select_grouped(choice, 2, 4, 2, biased=True).tolist()[0]) == [0, 2]


def test_weights_renormalize_and_scale() -> None:
    scores = torch.tensor([[0.1, 0.3, 0.2, 0.4]])
    ids = torch.tensor([[3, 1]])
    assert finish_weights(scores, ids, False, None).tolist()[0] == pytest.approx([0.4, 0.3])
    assert finish_weights(scores, ids, True, 2.5).tolist()[0] == pytest.approx([2.5 * 4 / 7, 2.5 * 3 / 7])


def _router(spec: dict, gate: torch.Tensor, **w: torch.Tensor) -> TorchRouter:
    return TorchRouter(Router.model_validate(spec), 2, RouterWeights(gate=gate, correction_bias=w.get("bias"),
                                                                   hash_table=w.get("table"),
                                                                   token_ids=w.get("tokens")), w.get("forced"))


def test_bias_selects_but_does_not_weigh() -> None:
    # x = identity, gate = diag → logits are the diagonal values
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    x, gate = torch.ones(1, 4), torch.diag(logits)
    spec = {"gate": {"dtype": "fp32"}, "scoring": "sigmoid", "select": {"kind": "topk"}, "bias": True}
    bias = torch.tensor([0.0, 0.0, 5.0, 0.0])      # pushes expert 2 into the top 2
    out = _router(spec, gate, bias=bias)(x)
    assert sorted(out.ids.tolist()[0]) == [0, 2]
    got = dict(zip(out.ids.tolist()[0], out.weights.tolist()[0], strict=True))
    assert got[0] == pytest.approx(1 / (1 + math.exp(-2.0)))
    assert got[2] == pytest.approx(0.5)           # sigmoid(0): the bias is not in the weight


def test_hash_selection_uses_the_table() -> None:
    table = torch.tensor([[0, 1], [2, 3], [3, 0]])
    tokens = torch.tensor([2, 0, 1])
    spec = {"gate": {"dtype": "fp32"}, "scoring": "softmax", "select": {"kind": "hash", "vocab": 3}}
    out = _router(spec, torch.randn(4, 5), table=table, tokens=tokens)(torch.randn(3, 5))
    assert out.ids.tolist() == [[3, 0], [0, 1], [2, 3]]


def test_forced_ids_replace_the_choice_and_take_their_scores() -> None:
    forced = torch.tensor([[3, 2]])
    spec = {"gate": {"dtype": "fp32"}, "scoring": "softmax", "select": {"kind": "topk"}, "renormalize": True}
    x, gate = torch.ones(1, 4), torch.diag(torch.tensor([2.0, 1.0, 0.0, -1.0]))
    out = _router(spec, gate, forced=forced)(x)
    assert out.ids.tolist() == [[3, 2]]
    e2, e3 = math.exp(0.0), math.exp(-1.0)
    assert out.weights.tolist()[0] == pytest.approx([e3 / (e2 + e3), e2 / (e2 + e3)], rel=1e-6)


@pytest.mark.parametrize("kind", ["silu", "gelu", "gelu_tanh"])
def test_gated_activations_by_hand(kind: str) -> None:
    h = torch.tensor([[1.0, -2.0, 0.5, 3.0]])     # gate = [1, -2], up = [0.5, 3]
    f = {"silu": lambda v: v / (1 + math.exp(-v)),
         "gelu": lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))),
         "gelu_tanh": lambda v: 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))}[kind]
    got = apply_activation(h, Activation(kind=kind)).tolist()[0]
    assert got == pytest.approx([f(1.0) * 0.5, f(-2.0) * 3.0], rel=1e-5)


def test_swigluoai_interleaved_by_hand() -> None:
    h = torch.tensor([[9.0, -8.0, 1.0, 0.5]])     # interleaved: gate = [9, 1], up = [-8, 0.5]
    act = Activation(kind="swigluoai", interleaved=True, limit=7.0, alpha=1.702)
    got = apply_activation(h, act).tolist()[0]
    g0, u0 = 7.0, -7.0                            # clamped
    want0 = (u0 + 1.0) * g0 / (1 + math.exp(-1.702 * g0))
    want1 = (0.5 + 1.0) * 1.0 / (1 + math.exp(-1.702))
    assert got == pytest.approx([want0, want1], rel=1e-5)


def test_silu_limit_clamps() -> None:
    h = torch.tensor([[20.0, 30.0]])
    got = apply_activation(h, Activation(kind="silu", limit=10.0)).item()
    assert got == pytest.approx(10.0 / (1 + math.exp(-10.0)) * 10.0, rel=1e-5)
