"""The vllm dsv4_attn backend on a GPU: DeepSeek-V4-Flash-sized attention (one rank, every attention projection
block FP8 with ue8m0 scales, wo_a included) through vLLM's DeepseekV4FlashMLAAttention, against the fp32
reference: a window-only decode, a ratio-4 decode beyond topk, a ratio-128 decode, a ratio-4 extend. Each
checks the output and what the row records (the backend, every cache's shape and padded page stride)."""

from __future__ import annotations

from typing import Any

import pytest

from operatorx.spec import Case
from tests.backends.vllm.cases import prepare_and_check

pytestmark = pytest.mark.gpu

_FP8 = {"a": {"dtype": "e4m3", "scale": {"dtype": "ue8m0", "static": False, "group": [1, 128]}},
        "b": {"dtype": "e4m3", "scale": {"dtype": "ue8m0", "static": True, "group": [128, 128]}}}
#: DeepSeek-V4-Flash's attention on one rank (64 heads: FlashMLA computes 64).
FLASH = {"hidden": 4096, "heads": 64, "head_dim": 512, "rope_dim": 64, "q_lora_rank": 1024, "window": 128,
         "o_groups": 8, "o_lora_rank": 1024, "rope_theta": 10000.0, "kv_cache_dtype": "fp8"}
YARN = {"type": "yarn", "factor": 16.0, "original_max": 65536, "beta_fast": 32.0, "beta_slow": 1.0}
COMPRESSED = {"compress_rope_theta": 160000.0, "rope_scaling": YARN}
INDEXER = {"indexer": "own", "topk": 512, "index_heads": 64, "index_dim": 128, "index_cache_dtype": "fp8"}
DECODE = [{"count": 4, "q": 1, "ctx": 8192}]
#: Every 584-byte cache page of 64 tokens padded to a multiple of 576 (37376 -> 37440 bytes).
SWA_STRIDE = [37440, 584, 1]


def _proj(ratio: int) -> dict[str, Any]:
    names = ["wq_a", "wkv", "wq_b", "wo_a", "wo_b"] + (["indexer.wq_b"] if ratio == 4 else [])
    return {n: _FP8 for n in names}


def _case(ratio: int, groups: list[dict[str, Any]], pages: str = "shuffled") -> Case:
    args: dict[str, Any] = {**FLASH, "compress_ratio": ratio, "proj": _proj(ratio),
                            "batch": {"groups": groups, "pages": pages, "seed": 3}}
    if ratio:
        args.update(COMPRESSED)
    if ratio == 4:
        args.update(INDEXER)
    return Case.model_validate({"type": "dsv4_attn", "args": args,
                                "sources": [f"deepseek-ai/DeepSeek-V4-Flash/attn:c{ratio}"]})


@pytest.fixture(scope="module")
def vllm_dsv4():
    pytest.importorskip("vllm")
    from operatorx.backends.vllm.attention.dsv4 import VllmDsv4

    return VllmDsv4()


def _recorded(meta: dict[str, Any], ratio: int, graph: bool = True) -> dict[str, Any]:
    """The row's record; `graph`: a uniform decode, which serving replays as one FULL graph and so is timed."""
    assert meta["module"].endswith("deepseek_v4.nvidia.flashmla.DeepseekV4FlashMLAAttention")
    assert meta["attention_backend"]["name"] == "FLASHMLA_SPARSE_DSV4"
    assert meta["compress_ratio"]["vllm"] == max(1, ratio)
    assert meta["kv_cache_dtype"]["vllm"] == "fp8_ds_mla"
    assert meta["heads"]["padded"] == 64
    assert meta["rotary_embedding"]["dtype"] == "float32" and meta["rotary_embedding"]["neox"] is False
    assert "graph_error" not in meta, meta.get("graph_error")
    assert meta["cuda_graph"] is graph and meta["graph_mode"] == ("full" if graph else "eager")
    assert meta["projections"]["scheme"] == "fp8_block"
    caches = meta["caches"]
    want = {"swa": [64, 584]}
    if ratio == 4:
        want.update(main=[64, 584], state=[4, 2048], index_keys=[64, 132], index_state=[4, 512])
    elif ratio == 128:
        want.update(main=[2, 584], state=[8, 1024])
    assert {k: c["shape"][1:] for k, c in caches.items()} == want
    assert caches["swa"]["stride"] == SWA_STRIDE and caches["swa"]["backend"] == "DEEPSEEK_SPARSE_SWA"
    for c in caches.values():
        assert c["page_bytes"] % 576 == 0 and c["page_bytes"] >= c["real_page_bytes"]
    if ratio:
        assert caches["main"]["backend"] == "FLASHMLA_SPARSE_DSV4" and caches["main"]["block_size"] == 256
        assert caches["state"]["backend"] == "CompressorBackend"
    if ratio == 4:
        assert caches["index_keys"]["backend"] == "DEEPSEEK_V4_INDEXER"
    return caches


def test_window_only_decode_matches_the_reference(vllm_dsv4):
    prepared, check = prepare_and_check(vllm_dsv4, _case(0, DECODE))
    assert check.ok, check.to_json()
    caches = _recorded(prepared.metadata, 0)
    assert caches["swa"]["stride"] == SWA_STRIDE
    assert prepared.metadata["requests"]["decode"] == 4


def test_ratio4_decode_beyond_topk_matches_the_reference(vllm_dsv4):
    """8192 ctx tokens: 2048 compressed entries, the indexer picks 512 of them."""
    prepared, check = prepare_and_check(vllm_dsv4, _case(4, DECODE))
    assert check.ok, check.to_json()
    meta = prepared.metadata
    caches = _recorded(meta, 4)
    assert caches["main"]["stride"] == [37440, 584, 1] and caches["index_keys"]["stride"] == [8640, 132, 1]
    assert caches["state"]["stride"] == [32832 // 4, 2048, 1]
    assert meta["indexer"]["topk"] == 512 and meta["indexer"]["fp4_cache"] is False
    assert meta["topk_overlap"]["vllm_picks_after_their_token"] == 0
    assert meta["boundaries"]["boundary_tokens"] == 0          # position 8192: (8192 + 1) % 4 != 0


def test_ratio128_decode_matches_the_reference(vllm_dsv4):
    prepared, check = prepare_and_check(vllm_dsv4, _case(128, DECODE))
    assert check.ok, check.to_json()
    meta = prepared.metadata
    caches = _recorded(meta, 128)
    assert caches["main"]["stride"] == [1728, 584, 1]           # 2 entries x 584 = 1168 -> 1728 bytes
    assert meta["indexer"] is None and meta["c128a_topk_width"]["entries"] % 128 == 0


def test_ratio4_extend_matches_the_reference(vllm_dsv4):
    """A prefill over a context: it crosses compress boundaries and pools cached states with new ones."""
    prepared, check = prepare_and_check(vllm_dsv4, _case(4, [{"count": 1, "q": 256, "ctx": 3001}]))
    assert check.ok, check.to_json()
    meta = prepared.metadata
    _recorded(meta, 4, graph=False)
    assert meta["requests"]["long_extend"] == 1
    assert meta["requests"]["swa_split"]["num_prefills"] == 1
    assert meta["boundaries"]["boundary_tokens"] == 64          # positions 3001..3256: (p + 1) % 4 == 0
