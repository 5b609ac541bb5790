"""The vllm mla_dsa backend: its refusals by field, the indexer's fp8 key-cache layout and read-back and the
selection read-back on the CPU; DeepSeek-V3.2-sized decode and prefill through vLLM's DeepseekV2MLAAttention
with its Indexer on a GPU (the `gpu` tests skip without CUDA or vLLM)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from operatorx.backends.torch.attention.layout import plan_layout
from operatorx.backends.vllm.attention.batch import RESERVED_BLOCKS, batch_index, vllm_slots
from operatorx.backends.vllm.attention.dsa import VllmMlaDsa
from operatorx.backends.vllm.attention.dsa_build import BuiltDsa
from operatorx.backends.vllm.attention.dsa_layout import (
    E4M3_MAX,
    index_cache_width,
    pack_index_block,
    quantize_keys,
    read_index_keys,
)
from operatorx.backends.vllm.attention.dsa_reuse import reused_topk
from operatorx.backends.vllm.attention.dsa_support import dsa_refusal, wk_upcast
from operatorx.spec import Case
from tests.backends.vllm.cases import prepare_and_check

YARN = {"type": "yarn", "factor": 40.0, "original_max": 4096, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
        "mscale_all_dim": 1.0}
#: DeepSeek-V3.2's attention, one rank.
DSV32 = {"hidden": 7168, "heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "nope": 128, "rope_dim": 64,
         "v": 128, "rope_theta": 10000.0, "rope_scaling": YARN, "topk": 2048, "index_heads": 64, "index_dim": 128}
DECODE = [{"count": 8, "q": 1, "ctx": 4096}]
FP8 = {"dtype": "e4m3", "scale": {"dtype": "fp32", "group": [1, 128], "static": False}}
FP8_BLOCK_W = {"dtype": "e4m3", "scale": {"dtype": "fp32", "group": [128, 128], "static": True}}
#: DeepSeek-V3.2's block-FP8 checkpoint: the MLA projections, indexer.wq_b and indexer.wk (weights_proj bf16).
FP8_PROJ = {name: {"a": FP8, "b": FP8_BLOCK_W}
            for name in ("q_a_proj", "kv_a_proj_with_mqa", "q_b_proj", "kv_b_proj", "o_proj", "indexer.wq_b",
                         "indexer.wk")}


def _case(groups: list[dict[str, Any]], pages: str = "contiguous", **extra: Any) -> Case:
    args = {**DSV32, **extra, "batch": {"groups": groups, "pages": pages, "seed": 3}}
    return Case.model_validate({"type": "mla_dsa", "args": args, "sources": ["deepseek-ai/DeepSeek-V3.2/self_attn"]})


# --- CPU: no vLLM needed --------------------------------------------------------------------------------

#: The MLA projections of FP8_PROJ: what a reuse layer of a block-FP8 checkpoint (GLM-5.2's shared layers) has.
FP8_MLA_PROJ = {k: v for k, v in FP8_PROJ.items() if not k.startswith("indexer.")}


def test_deepseek_v32_is_accepted():
    assert dsa_refusal(_case(DECODE).args) is None
    assert dsa_refusal(_case(DECODE, proj=FP8_PROJ).args) is None
    assert wk_upcast(_case(DECODE, proj=FP8_PROJ).args) and not wk_upcast(_case(DECODE).args)


@pytest.mark.parametrize("extra", [{}, {"proj": FP8_MLA_PROJ}, {"index_dim": 64}], ids=["bf16", "fp8-block", "dim64"])
def test_a_reuse_layer_is_accepted_by_its_mla_projections_alone(extra):
    """vLLM's skip layer builds no Indexer: index_dim and the indexer projections are not its to check."""
    assert dsa_refusal(_case(DECODE, indexer="reuse", **extra).args) is None
    why = dsa_refusal(_case(DECODE, indexer="reuse", proj={"q_b_proj": {"a": FP8, "b": FP8_BLOCK_W}}).args)
    assert why is not None and "bf16 beside quantized projections" in why


@pytest.mark.parametrize(("extra", "words"), [
    ({"proj": {"indexer.wk": {"a": {"dtype": "bf16"}, "b": FP8_BLOCK_W}}}, "dequantizes only a block-FP8 wk"),
    ({"proj": {**FP8_PROJ, "indexer.weights_proj": {"a": FP8, "b": FP8_BLOCK_W}}}, "proj.indexer.weights_proj"),
    ({"proj": {k: v for k, v in FP8_PROJ.items() if k != "indexer.wq_b"}}, "proj.indexer.wq_b: bf16 beside fp8"),
    ({"proj": {"indexer.wq_b": {"a": FP8, "b": FP8_BLOCK_W}}}, "proj.indexer.wq_b: fp8_block beside bf16"),
    ({"proj": {"q_b_proj": {"a": FP8, "b": FP8_BLOCK_W}}}, "bf16 beside quantized projections"),
    ({"kv_cache_dtype": "fp8_ds_mla"}, "kv_cache_dtype=fp8_ds_mla"),
    ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype=fp8"),
    ({"index_dim": 64}, "index_dim=64"),
    ({"selection": "uniform"}, "selection=uniform"),
    ({"parallel": {"tp": 2}}, "multi-rank vLLM attention is not built"),
])
def test_refusals_name_their_field(extra, words):
    why = dsa_refusal(_case(DECODE, **extra).args)
    assert why is not None and words in why, why
    assert VllmMlaDsa().supports(_case(DECODE, **extra), "cuda") == why


def test_an_mla_case_is_not_mla_dsa_and_the_cpu_is_refused():
    mla = {k: v for k, v in DSV32.items() if k not in ("topk", "index_heads", "index_dim")}
    case = Case.model_validate({"type": "mla", "args": {**mla, "batch": {"groups": DECODE}},
                                "sources": ["org/model/self_attn"]})
    assert "runs mla_dsa only" in (VllmMlaDsa().supports(case, "cuda") or "")
    assert "cpu" in (VllmMlaDsa().supports(_case(DECODE), "cpu") or "")


def test_bounds():
    assert VllmMlaDsa().bound(_case(DECODE).args) == pytest.approx(2e-2)
    assert VllmMlaDsa().bound(_case(DECODE, proj=FP8_PROJ).args) >= 2e-2


def test_the_check_describes_how_much_of_vllms_selection_the_reference_holds():
    from types import SimpleNamespace

    from operatorx.backends.vllm.attention.base import with_topk_overlap

    own = [torch.tensor([[0, 1, 2, 3]]), torch.tensor([[4, 5, -1, -1]])]
    used = [torch.tensor([[0, 1, 2, 9]]), torch.tensor([[5, 4, 7, -1]])]
    ref = SimpleNamespace(rows=torch.tensor([0, 1]), out=torch.zeros(2, 3), what="fp32 reference",
                          own_indices=own, used_indices=used, invalid_picks=0)
    meta: dict[str, Any] = {}
    described = with_topk_overlap(ref, meta)
    assert meta["topk_overlap"] == {"min": 0.75, "mean": 0.875, "vllm_picks_after_their_token": 0}
    assert described.what == ("fp32 reference; the reference's own top-k holds 0.750 (worst request) of vLLM's "
                              "picks; 0 of vLLM's picks are after their token")
    assert described.rows is ref.rows and described.out is ref.out


def test_quantized_keys_use_power_of_two_scales():
    keys = torch.randn(5, 7, 128, generator=torch.Generator().manual_seed(0)) * 3
    values, scale = quantize_keys(keys)
    assert values.dtype == torch.float8_e4m3fn and scale.shape == (5, 7)
    assert torch.equal(torch.exp2(torch.log2(scale).round()), scale)          # ue8m0
    ratio = keys.abs().amax(-1) / scale
    assert bool((ratio <= E4M3_MAX).all()) and bool((ratio > E4M3_MAX / 2).all())
    back = values.float() * scale[..., None]
    assert float(((back - keys).abs() / keys.abs().amax(-1, keepdim=True)).max()) < 2 ** -4


def test_packed_block_is_values_then_scales():
    bs, dim = 64, 128
    keys = torch.randn(2, bs, dim, generator=torch.Generator().manual_seed(1))
    cache = pack_index_block(keys)
    assert cache.shape == (2, bs, index_cache_width(dim)) == (2, 64, 132) and cache.dtype == torch.uint8
    values, scale = quantize_keys(keys)
    flat = cache.reshape(2, -1)
    t = 37                                                     # token 37 of block 1
    assert torch.equal(flat[1, t * dim:(t + 1) * dim], values[1, t].view(torch.uint8))
    got = flat[1, bs * dim + 4 * t: bs * dim + 4 * t + 4].view(torch.float32)
    assert float(got) == float(scale[1, t])


def test_index_keys_read_back_through_the_block_table():
    """Keys written at vLLM's slots (block = page + 1) are read back in position order, shuffled pages and all."""
    layout = plan_layout(_case([{"count": 3, "q": 1, "ctx": 150}], pages="shuffled").args.batch, None, 64)
    blocks = layout.pool_pages + RESERVED_BLOCKS
    keys = torch.randn(blocks, 64, 128, generator=torch.Generator().manual_seed(2))
    cache = pack_index_block(keys)
    values, scale = quantize_keys(keys)
    want_all = (values.float() * scale[..., None]).view(-1, 128)
    for r in layout.requests:
        got = read_index_keys(cache, r, 128)
        assert got.shape == (150, 128)
        assert torch.equal(got, want_all[vllm_slots(r, 0, r.ctx)])
    with pytest.raises(ValueError, match="width"):
        read_index_keys(cache[..., :130], layout.requests[0], 128)


def test_selection_reads_the_buffer_in_batch_order():
    """vLLM's buffer rows follow the batch order (decodes first); the reference asks by layout row."""
    layout = plan_layout(_case([{"count": 1, "q": 5, "ctx": 0}, {"count": 2, "q": 1, "ctx": 70}]).args.batch, None, 64)
    index = batch_index(layout, 256)
    assert index.order == (1, 2, 0)
    buffer = torch.arange(index.num_tokens, dtype=torch.int32)[:, None].repeat(1, 4)   # row j holds j
    fake = SimpleNamespace(index=index, topk_indices=buffer)
    prefill = layout.requests[0]
    got = BuiltDsa.selection(fake, prefill, torch.tensor([0, 4]))  # type: ignore[arg-type]
    assert got.dtype == torch.int64 and got[:, 0].tolist() == [2, 6]       # after the two decodes
    assert BuiltDsa.selection(fake, layout.requests[2], torch.tensor([0]))[:, 0].tolist() == [1]  # type: ignore[arg-type]


def test_reused_topk_keeps_every_key_a_token_sees_up_to_topk():
    got = reused_topk(torch.tensor([0, 3, 7]), 8, torch.Generator().manual_seed(0))
    assert got.dtype == torch.int32 and got.shape == (3, 8)
    assert got.tolist() == [[0] + [-1] * 7, [0, 1, 2, 3] + [-1] * 4, list(range(8))]


def test_reused_topk_draws_distinct_causal_positions_uniformly(monkeypatch):
    import operatorx.backends.vllm.attention.dsa_reuse as reuse

    monkeypatch.setattr(reuse, "DRAW_CHUNK_BYTES", 4 * 1000 * 7)          # seven rows a draw: chunks covered
    pos = torch.tensor([999] * 40 + [5, 500])
    got = reuse.reused_topk(pos, 64, torch.Generator().manual_seed(1))
    for row, p in zip(got.tolist(), pos.tolist(), strict=True):
        picked = [i for i in row if i >= 0]
        assert len(picked) == len(set(picked)) == min(p + 1, 64) and picked == sorted(picked)
        assert row[len(picked):] == [-1] * (64 - len(picked)) and max(picked) <= p
    spread = got[:40].float()
    assert abs(float(spread.mean()) - 499.5) < 15                           # uniform over 0 .. 999: sd ~5.7
    assert not torch.equal(got[0], got[1])
    again = reuse.reused_topk(pos, 64, torch.Generator().manual_seed(1))
    assert torch.equal(got, again)


# --- GPU: vLLM's own module ----------------------------------------------------------------------------

#: VllmMlaDsa is a first cut, not registered: these have not run on an H200 yet.
@pytest.fixture(scope="module")
def vllm_dsa():
    pytest.importorskip("vllm")
    return VllmMlaDsa()


def _recorded(meta: dict[str, Any]) -> None:
    assert meta["module"].endswith("deepseek_v2.DeepseekV2MLAAttention")
    assert meta["attention_backend"]["sparse"] is True
    assert meta["index_backend"]["name"] == "DEEPSEEK_V32_INDEXER"
    assert meta["kv_cache"]["shape"][1:] == [64, 576] and meta["kv_cache"]["dtype"] == "bfloat16"
    assert meta["index_cache"]["shape"][1:] == [64, 132] and meta["index_cache"]["dtype"] == "uint8"
    assert meta["indexer_rotary_embedding"]["neox"] is True
    assert meta["softmax_scale"]["vllm"] == pytest.approx(meta["softmax_scale"]["reference"], rel=1e-6)
    assert meta["topk_overlap"]["mean"] > 0.9, meta["topk_overlap"]


@pytest.mark.gpu
def test_decode_beyond_topk_matches_the_reference(vllm_dsa):
    prepared, check = prepare_and_check(vllm_dsa, _case(DECODE, pages="shuffled"))
    assert check.ok, check.to_json()
    meta = prepared.metadata
    _recorded(meta)
    assert meta["requests"]["decode"] == 8 and meta["index_backend"]["topk"] == 2048


@pytest.mark.gpu
@pytest.mark.parametrize("groups", [[{"count": 1, "q": 512, "ctx": 0}], [{"count": 1, "q": 1024, "ctx": 3000}]],
                         ids=["prefill-within-topk", "extend-beyond-topk"])
def test_prefill_matches_the_reference(vllm_dsa, groups):
    prepared, check = prepare_and_check(vllm_dsa, _case(groups, pages="shuffled"))
    assert check.ok, check.to_json()
    _recorded(prepared.metadata)
    assert prepared.metadata["cuda_graph"] is False


@pytest.mark.gpu
def test_block_fp8_projections_match_the_reference(vllm_dsa):
    prepared, check = prepare_and_check(vllm_dsa, _case(DECODE, pages="shuffled", proj=FP8_PROJ))
    assert check.ok, check.to_json()
    assert prepared.metadata["projections"]["scheme"] == "fp8_block"
    assert prepared.metadata["indexer_wk"].startswith("proj.indexer.wk is block FP8")


@pytest.mark.gpu
@pytest.mark.parametrize(("groups", "extra"), [
    (DECODE, {}),
    ([{"count": 4, "q": 1, "ctx": 4096}, {"count": 1, "q": 512, "ctx": 3000}], {"proj": FP8_MLA_PROJ}),
], ids=["decode-beyond-topk", "mixed-block-fp8"])
def test_a_reuse_layer_reads_the_filled_buffer(vllm_dsa, groups, extra):
    """vLLM's skip layer (GLM-5.2's shared layers): no Indexer, the attention over the buffer as filled (the
    build refuses a forward that wrote it)."""
    prepared, check = prepare_and_check(vllm_dsa, _case(groups, pages="shuffled", indexer="reuse", **extra))
    assert check.ok, check.to_json()
    meta = prepared.metadata
    assert meta["indexer"]["kind"] == "reuse" and meta["indexer"]["skip_topk"] is True
    assert "index_cache" not in meta and "index_backend" not in meta and "topk_overlap" not in meta
    assert meta["attention_backend"]["sparse"] is True
    assert "no indexer (reuse" in check.to_json()["reference"]
