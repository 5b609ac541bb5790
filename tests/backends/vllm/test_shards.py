"""A rank's shard of a whole checkpoint tensor, found from the parameter's shape (backends/vllm/shards.py):
experts by ep rank along dim 0, each w13 half and w2's last dim by tp rank, merged gate/up rows half by half."""

from __future__ import annotations

import torch

from operatorx.backends.vllm.shards import expert_merged_dim, shard_for_rank, shard_tensors


def _numbered(*shape: int) -> torch.Tensor:
    return torch.arange(int(torch.tensor(shape).prod())).reshape(shape)


def test_ep_keeps_this_ranks_whole_experts():
    w13 = _numbered(8, 6, 4)                              # E=8, 2I=6, H=4
    for rank in range(4):
        got = shard_for_rank(w13, (2, 6, 4), rank, merged=1)
        assert torch.equal(got, w13[2 * rank:2 * rank + 2])


def test_tp_cuts_each_w13_half_and_w2s_intermediate():
    e, i, h = 2, 4, 3
    w13 = _numbered(e, 2 * i, h)
    gate, up = w13[:, :i], w13[:, i:]
    got = shard_for_rank(w13, (e, i, h), rank=1, merged=1)      # tp=2: I/2 of gate, then I/2 of up
    assert torch.equal(got, torch.cat([gate[:, 2:4], up[:, 2:4]], dim=1))
    w2 = _numbered(e, h, i)
    assert torch.equal(shard_for_rank(w2, (e, h, i // 2), rank=0), w2[:, :, :2])
    # a block-scale tensor follows the same rule on its block counts
    scale = _numbered(e, 4, 2)                           # [E, 2I/128, H/128] with I = 256
    assert torch.equal(shard_for_rank(scale, (e, 2, 2), rank=1, merged=1), scale[:, [1, 3]])


def test_a_tensor_that_does_not_split_evenly_is_left_for_the_loader_to_name():
    t = _numbered(3, 5)
    assert shard_for_rank(t, (3, 2), rank=0) is t        # 5 is no multiple of 2
    assert shard_for_rank(t, (3, 10), rank=0) is t       # a padded (larger) parameter: not a shard
    assert shard_for_rank(t, (3,), rank=0) is t          # another rank of tensor
    odd_halves = _numbered(1, 6, 1)                      # halves of 3 rows do not split in 2
    assert shard_for_rank(odd_halves, (1, 3, 1), rank=0, merged=1) is odd_halves


def test_shard_tensors_names_the_merged_dim_by_tensor_name():
    e, i, h = 2, 4, 2
    tensors = {"w13_weight": _numbered(e, 2 * i, h), "w2_weight": _numbered(e, h, i), "other": _numbered(3)}
    shapes = {"w13_weight": (e, i, h), "w2_weight": (e, h, i // 2)}
    got = shard_tensors(tensors, shapes, rank=0)
    w13 = tensors["w13_weight"]
    assert torch.equal(got["w13_weight"], torch.cat([w13[:, :2], w13[:, 4:6]], dim=1))
    assert torch.equal(got["w2_weight"], tensors["w2_weight"][:, :, :2])
    assert got["other"] is tensors["other"]
    assert expert_merged_dim("w13_weight_scale_inv") == 1 and expert_merged_dim("w2_weight") is None
