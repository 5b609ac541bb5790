"""The vllm mla backend: its refusals, 64-token pages, vLLM's batch index and the latent read-back on the CPU;
DeepSeek-V3-sized decode, prefill and a mixed batch through vLLM's DeepseekV2MLAAttention on a GPU (the `gpu`
tests skip without CUDA or vLLM)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from operatorx.backends.torch.attention.layout import PAGE_TOKENS, plan_layout
from operatorx.backends.vllm.attention.batch import RESERVED_BLOCKS, batch_index, block_offsets, cached_latents
from operatorx.backends.vllm.attention.mla import VllmMla
from operatorx.backends.vllm.attention.mla_module import rope_parameters
from operatorx.backends.vllm.attention.support import mla_refusal
from operatorx.spec import Case
from tests.backends.vllm.cases import prepare_and_check

YARN = {"type": "yarn", "factor": 40.0, "original_max": 4096, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
        "mscale_all_dim": 1.0}
#: DeepSeek-V3's attention, one rank.
DSV3 = {"hidden": 7168, "heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "nope": 128, "rope_dim": 64,
        "v": 128, "rope": True, "rope_theta": 10000.0, "rope_scaling": YARN}
DECODE = [{"count": 16, "q": 1, "ctx": 1024}]
PREFILL = [{"count": 1, "q": 512, "ctx": 0}]
MIXED = [{"count": 4, "q": 1, "ctx": 1024}, {"count": 1, "q": 600, "ctx": 300}, {"count": 1, "q": 700, "ctx": 0}]
FP8 = {"dtype": "e4m3", "scale": {"dtype": "fp32", "group": [1, 128], "static": False}}
FP8_BLOCK_W = {"dtype": "e4m3", "scale": {"dtype": "fp32", "group": [128, 128], "static": True}}
#: DeepSeek-V3's block-FP8 projections (every one).
FP8_PROJ = {name: {"a": FP8, "b": FP8_BLOCK_W}
            for name in ("q_a_proj", "kv_a_proj_with_mqa", "q_b_proj", "kv_b_proj", "o_proj")}


def _case(groups: list[dict[str, Any]], pages: str = "contiguous", **extra: Any) -> Case:
    args = {**DSV3, **extra, "batch": {"groups": groups, "pages": pages, "seed": 3}}
    return Case.model_validate({"type": "mla", "args": args, "sources": ["deepseek-ai/DeepSeek-V3/self_attn"]})


# --- CPU: no vLLM needed --------------------------------------------------------------------------------

def test_deepseek_v3_is_accepted():
    assert mla_refusal(_case(DECODE).args) is None
    assert mla_refusal(_case(DECODE, proj=FP8_PROJ).args) is None     # its block-FP8 checkpoint too
    assert mla_refusal(_case(DECODE, kv_cache_dtype="fp8").args) is None  # and an fp8 latent cache


@pytest.mark.parametrize(("extra", "words"), [
    ({"gate": True}, "gate: MLA's output gate"),
    ({"rope": False, "rope_theta": None, "rope_scaling": None}, "rope off"),
    ({"proj": {"q_b_proj": {"a": FP8, "b": FP8}}}, "proj.q_b_proj: dynamic weight scales"),
    ({"proj": {"q_b_proj": {"a": FP8, "b": FP8_BLOCK_W}}}, "bf16 beside quantized projections"),
    ({"parallel": {"tp": 2}}, "multi-rank vLLM attention is not built"),
])
def test_refusals_name_their_field(extra, words):
    why = mla_refusal(_case(DECODE, **extra).args)
    assert why is not None and words in why
    assert VllmMla().supports(_case(DECODE, **extra), "cuda") == why


def test_a_gqa_case_is_not_mla():
    gqa = Case.model_validate({"type": "gqa", "args": {
        "hidden": 256, "q_heads": 8, "kv_heads": 2, "head_dim": 64, "rope_dim": 64, "rope_theta": 1e4,
        "batch": {"groups": DECODE}}, "sources": ["org/model/self_attn"]})
    why = VllmMla().supports(gqa, "cuda")
    assert why is not None and "runs mla only" in why


def test_cpu_device_is_refused():
    why = VllmMla().supports(_case(DECODE), "cpu")
    assert why is not None and "cpu" in why


def test_yarn_rope_parameters_carry_only_the_set_fields():
    rope = rope_parameters(_case(DECODE).args)
    assert rope == {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                    "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                    "mscale_all_dim": 1.0}
    bare = rope_parameters(_case(DECODE, rope_scaling={"type": "yarn", "factor": 4.0, "original_max": 2048}).args)
    assert bare == {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                    "original_max_position_embeddings": 2048}
    assert rope_parameters(_case(DECODE, rope_scaling=None).args) == {"rope_type": "default", "rope_theta": 10000.0}


def test_default_layout_keeps_16_token_pages():
    layout = plan_layout(_case(MIXED).args.batch)
    assert layout.page_tokens == PAGE_TOKENS == 16
    assert layout.pool_pages == 4 * 65 + 57 + 44          # ceil(1025/16), ceil(900/16), ceil(700/16)
    assert all(r.page_tokens == 16 for r in layout.requests)


def test_layout_with_64_token_pages():
    batch = _case(MIXED, pages="shuffled").args.batch
    layout = plan_layout(batch, None, 64)
    assert layout.page_tokens == 64
    assert [len(r.pages) for r in layout.requests] == [17, 17, 17, 17, 15, 11]   # ceil((ctx + q) / 64)
    assert layout.pool_pages == 4 * 17 + 15 + 11 and layout.pool_slots == layout.pool_pages * 64
    assert sorted(p for r in layout.requests for p in r.pages) == list(range(layout.pool_pages))
    r = layout.requests[4]                                   # ctx 300: position 300 is in its page 4, offset 44
    assert r.slot(300) == r.pages[4] * 64 + 44
    assert r.slots(299, 302).tolist() == [r.pages[4] * 64 + 43, r.pages[4] * 64 + 44, r.pages[4] * 64 + 45]
    assert layout.write_slots().numel() == layout.tokens


def test_batch_index_with_64_token_pages_is_decode_first():
    layout = plan_layout(_case(MIXED, pages="shuffled").args.batch, None, 64)
    ix = batch_index(layout, 512)                            # FlashAttnMLAMetadataBuilder's threshold
    assert ix.order == (0, 1, 2, 3, 4, 5)
    assert ix.regions == ("decode",) * 4 + ("long_extend", "prefill")
    assert ix.num_blocks == layout.pool_pages + RESERVED_BLOCKS
    r = layout.requests[4]
    assert ix.block_table[4, :len(r.pages)].tolist() == [p + 1 for p in r.pages]
    first_new = int(ix.query_start_loc[4])                   # its first new token, position 300
    assert int(ix.slot_mapping[first_new]) == (r.pages[300 // 64] + 1) * 64 + 300 % 64
    assert int(ix.positions[first_new]) == 300
    assert int(ix.slot_mapping.max()) < ix.num_blocks * 64


def test_latent_read_back_finds_what_the_slot_mapping_wrote():
    """A write at vLLM's slots (concat_and_cache_mla: cache.view(-1, D)[slot] = [latent | rope key]) is read
    back by cached_latents / block_offsets at the same positions, through the block table."""
    layout = plan_layout(_case(MIXED, pages="shuffled").args.batch, None, 64)
    ix = batch_index(layout, 512)
    width = 576
    cache = torch.zeros(ix.num_blocks, 64, width)
    rows = torch.arange(ix.num_tokens, dtype=torch.float32)[:, None].expand(-1, width)
    cache.view(-1, width)[ix.slot_mapping] = rows + 1.0        # token j of the batch writes j + 1
    for b, i in enumerate(ix.order):
        r = layout.requests[i]
        blocks, offsets = block_offsets(r, r.ctx, r.ctx + r.q)
        got = cache[blocks, offsets][:, 0]
        start = int(ix.query_start_loc[b])
        assert got.tolist() == [float(start + j + 1) for j in range(r.q)]
    r = layout.requests[0]                                    # its cached context: untouched by the writes
    assert cached_latents(cache, r).shape == (1024, width)
    assert float(cached_latents(cache, r).abs().sum()) == 0.0


def test_latent_read_back_order_and_blocks():
    layout = plan_layout(_case([{"count": 2, "q": 1, "ctx": 130}], pages="shuffled").args.batch, None, 64)
    cache = torch.arange(float((layout.pool_pages + 1) * 64 * 3)).view(layout.pool_pages + 1, 64, 3)
    r = layout.requests[1]
    got = cached_latents(cache, r)
    assert got.dtype == torch.float32 and got.shape == (130, 3)
    for p in (0, 63, 64, 129):                               # position p: block pages[p // 64] + 1, offset p % 64
        assert got[p].tolist() == cache[r.pages[p // 64] + 1, p % 64].tolist()


def test_fp8_latents_read_back_as_e4m3_times_k_scale():
    """An fp8 cache's uint8 bytes are e4m3 values of row / k_scale: the read-back is their value times k_scale,
    not the bytes as numbers."""
    layout = plan_layout(_case([{"count": 1, "q": 1, "ctx": 70}]).args.batch, None, 64)
    values = torch.tensor([0.5, -1.25, 3.0]).repeat((layout.pool_pages + 1) * 64, 1).view(-1, 64, 3)
    cache = values.to(torch.float8_e4m3fn).view(torch.uint8)
    got = cached_latents(cache, layout.requests[0], k_scale=2.0)
    assert got.shape == (70, 3)
    assert got[0].tolist() == [1.0, -2.5, 6.0] and got[69].tolist() == [1.0, -2.5, 6.0]


# --- GPU: vLLM's own module ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vllm_mla():
    pytest.importorskip("vllm")
    return VllmMla()


def _backend_recorded(meta: dict[str, Any], cache_dtype: str = "bfloat16") -> None:
    assert meta["module"].endswith("deepseek_v2.DeepseekV2MLAAttention")
    backend = meta["attention_backend"]
    assert backend["name"] and backend["class"].endswith("Backend") and backend["impl"].endswith("Impl")
    assert meta["metadata_builder"].endswith("MetadataBuilder")
    cache = meta["kv_cache"]
    assert cache["shape"][1:] == [cache["block_size"], 512 + 64] and cache["dtype"] == cache_dtype
    assert cache["spec"] == "MLAAttentionSpec"
    assert meta["rotary_embedding"] == "DeepseekScalingRotaryEmbedding"
    assert meta["softmax_scale"]["vllm"] == pytest.approx(meta["softmax_scale"]["reference"], rel=1e-6)


@pytest.mark.gpu
def test_decode_matches_the_reference(vllm_mla):
    prepared, check = prepare_and_check(vllm_mla, _case(DECODE, pages="shuffled"))
    assert check.ok, check.to_json()
    meta = prepared.metadata
    _backend_recorded(meta)
    assert meta["requests"]["decode"] == 16 and meta["requests"]["prefill"] == 0
    assert meta["requests"]["builder_split"]["num_decodes"] == 16
    assert meta["prefill_metadata"] is None
    assert "graph_error" not in meta, meta.get("graph_error")


@pytest.mark.gpu
@pytest.mark.parametrize("q", [512, 1024])
def test_prefill_matches_the_reference(vllm_mla, q):
    prepared, check = prepare_and_check(vllm_mla, _case([{"count": 1, "q": q, "ctx": 0}]))
    assert check.ok, check.to_json()
    meta = prepared.metadata
    _backend_recorded(meta)
    split = meta["requests"]["builder_split"]
    assert split["num_decodes"] + split["num_prefills"] == 1
    # at most reorder_batch_threshold new tokens go through vLLM's decode (MQA) path, more through forward_mha
    assert split["num_prefills"] == (1 if q > meta["reorder_batch_threshold"] else 0)
    assert meta["cuda_graph"] is False


@pytest.mark.gpu
def test_mixed_batch_matches_the_reference(vllm_mla):
    prepared, check = prepare_and_check(vllm_mla, _case(MIXED, pages="shuffled"))
    assert check.ok, check.to_json()
    meta = prepared.metadata
    _backend_recorded(meta)
    assert meta["requests"]["decode"] == 4 and meta["requests"]["prefill"] == 1
    split = meta["requests"]["builder_split"]
    assert split["num_decodes"] + split["num_prefills"] == 6 and split["num_prefills"] >= 1
    assert meta["chunked_context"] is True                    # the ctx-300 extend reads its context in chunks
    assert meta["cuda_graph"] is False


@pytest.mark.gpu
@pytest.mark.parametrize("groups", [DECODE, MIXED], ids=["decode", "mixed"])
def test_block_fp8_projections(vllm_mla, groups):
    """DeepSeek-V3's FP8 checkpoint form, one rank of tp8 (16 heads); the mixed batch runs kv_b_proj as an
    fp8 layer over the prefills' latents."""
    prepared, check = prepare_and_check(vllm_mla, _case(groups, pages="shuffled", heads=16, proj=FP8_PROJ))
    assert check.ok, check.to_json()
    assert "fp8_block activations quantized with" in check.reference
    proj = prepared.metadata["projections"]
    assert proj["scheme"] == "fp8_block"
    for name in ("fused_qkv_a_proj", "q_b_proj", "kv_b_proj", "o_proj"):
        assert proj["layers"][name]["quant_method"] == "Fp8LinearMethod", proj


@pytest.mark.gpu
@pytest.mark.parametrize("groups", [DECODE, MIXED], ids=["decode", "mixed"])
def test_fp8_latent_cache(vllm_mla, groups):
    """`kv_cache_dtype: fp8`, one rank of tp8: on sm90 vLLM takes FLASHMLA (FLASH_ATTN_MLA has no fp8 cache), its
    64-token pages of e4m3 latents (uint8 storage, the layer's default scales 1.0); the decodes run FlashMLA's
    fp8 kernel, the mixed batch's prefills read their context dequantized."""
    prepared, check = prepare_and_check(vllm_mla, _case(groups, pages="shuffled", heads=16, kv_cache_dtype="fp8"))
    assert check.ok, check.to_json()
    meta = prepared.metadata
    _backend_recorded(meta, cache_dtype="uint8")
    cache = meta["kv_cache"]
    assert cache["cache_dtype"] == "fp8" and cache["scales"] == {"q": 1.0, "k": 1.0}
    if torch.cuda.get_device_capability()[0] == 9:
        assert meta["attention_backend"]["name"] == "FLASHMLA" and cache["block_size"] == 64
    assert cache["bytes"] == cache["num_blocks"] * cache["block_size"] * (512 + 64)
    assert meta["requests"]["decode"] == (16 if groups is DECODE else 4)
