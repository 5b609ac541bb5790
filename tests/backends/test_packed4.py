"""The 4-bit checkpoint formats, bit by bit, on the CPU (backends/packed4.py)."""

from __future__ import annotations

import pytest
import torch

from operatorx.backends.packed4 import (
    E2M1_MAGNITUDES,
    Int4Packed,
    MxFp4,
    dequantize_int4,
    dequantize_mxfp4,
    quantize_int4,
    quantize_mxfp4,
)


def test_mxfp4_bits_are_the_ocp_layout():
    """One row of 32: value 2k-th and (2k+1)-th share byte k, the even one in the low nibble; e2m1 code
    = sign bit 3 | magnitude index; the block scale 2^0 is ue8m0 127."""
    row = torch.tensor([[0.5, -6.0, 1.5, 0.0] + [1.0] * 28])
    m = quantize_mxfp4(row)
    assert m.packed.dtype == torch.uint8 and m.packed.shape == (1, 16) and m.scales.tolist() == [[127]]
    assert m.packed[0, 0].item() == 0x1 | (0xF << 4)           # 0.5 → code 1; -6 → 8 | 7
    assert m.packed[0, 1].item() == 0x3 | (0x0 << 4)           # 1.5 → code 3; 0 → code 0
    assert m.packed[0, 2].item() == 0x2 | (0x2 << 4)           # 1.0 → code 2
    assert torch.equal(dequantize_mxfp4(m), row)


def test_mxfp4_scales_each_block_by_a_power_of_two_and_round_trips_what_it_can_hold():
    torch.manual_seed(0)
    mags = torch.tensor(E2M1_MAGNITUDES)
    codes = torch.randint(0, 8, (8, 64))
    signs = torch.where(torch.rand(8, 64) < 0.5, -1.0, 1.0)
    blocks = torch.tensor([2.0 ** e for e in range(-4, 4)])[:, None]       # one scale a row
    w = mags[codes] * signs * blocks                            # every value exact in MXFP4
    w[:, 0] = 6.0 * blocks[:, 0]                                # each row's blocks reach the top code
    w[:, 32] = -6.0 * blocks[:, 0]
    m = quantize_mxfp4(w)
    assert torch.equal(dequantize_mxfp4(m), w)
    assert m.scales[:, 0].tolist() == [127 + e for e in range(-4, 4)]


def test_mxfp4_rounds_to_the_nearest_magnitude_and_ties_to_the_even_code():
    row = torch.tensor([[6.0, 0.74, 0.76, 0.75, 2.5, 5.0, -1.25, 0.26] + [0.0] * 24])
    got = dequantize_mxfp4(quantize_mxfp4(row))[0, :8].tolist()
    # 0.75 ties 0.5 (code 1) and 1.0 (code 2): the even code; 2.5 ties 2 (4) and 3 (5); 5 ties 4 (6) and 6 (7)
    assert got == [6.0, 0.5, 1.0, 1.0, 2.0, 4.0, -1.0, 0.5]


def test_mxfp4_error_on_random_weights_is_within_half_a_step():
    torch.manual_seed(1)
    w = torch.randn(16, 256)
    back = dequantize_mxfp4(quantize_mxfp4(w))
    step = torch.exp2(torch.ceil(torch.log2(w.reshape(16, 8, 32).abs().amax(-1) / 6.0)))   # block scale
    # the widest gap between e2m1 magnitudes is 2 (between 4 and 6): half of it, times the block scale
    assert bool(((back - w).abs().reshape(16, 8, 32) <= step.unsqueeze(-1) * 1.0 + 1e-6).all())


def test_int4_bits_are_compressed_tensors_pack_quantized():
    """Eight values a word, value + 8 in bits 4j..4j+3 of element j; a group of 32 shares a scale (1
    here: the group's largest magnitude is 7)."""
    eight = [-7, -1, 0, 1, 7, 3, -3, 2]
    vals = torch.tensor([eight * 4], dtype=torch.float32)
    p = quantize_int4(vals)
    assert p.packed.dtype == torch.int32 and p.packed.shape == (1, 4) and p.shape == (1, 32)
    word = sum((v + 8) << (4 * j) for j, v in enumerate(eight))
    assert word >= 2**31 and p.packed[0, 0].item() == word - 2**32        # the top nibble sets the sign bit
    assert p.scales.tolist() == [[1.0]] and torch.equal(dequantize_int4(p), vals)


def test_int4_round_trips_integers_scaled_by_powers_of_two():
    torch.manual_seed(2)
    q = torch.randint(-7, 8, (4, 64)).float()
    q[:, 0], q[:, 32] = 7.0, -7.0
    scales = torch.tensor([0.25, 1.0, 4.0, 0.0625])[:, None]
    w = q * scales
    p = quantize_int4(w)
    assert torch.equal(dequantize_int4(p), w)
    assert p.scales[:, 0].tolist() == [0.25, 1.0, 4.0, 0.0625]
    assert torch.equal(p.scales.to(torch.bfloat16).float(), p.scales)       # exact as a checkpoint stores them


@pytest.mark.parametrize("fn", [quantize_mxfp4, quantize_int4])
def test_k_must_fill_whole_scale_groups(fn):
    with pytest.raises(ValueError, match="multiple of the 32-value scale group"):
        fn(torch.ones(2, 48))


def test_formats_are_typed():
    assert MxFp4.__dataclass_params__.frozen and Int4Packed.__dataclass_params__.frozen   # type: ignore[attr-defined]
