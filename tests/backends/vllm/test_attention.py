"""The vllm gqa backend: its refusals and vLLM's batch index on the CPU; decode and prefill through vLLM's
own attention module on a GPU (the `gpu` tests skip without CUDA or vLLM)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from operatorx.backends.torch.attention.layout import PAGE_TOKENS, plan_layout
from operatorx.backends.vllm.attention import VllmGqa
from operatorx.backends.vllm.attention.batch import RESERVED_BLOCKS, batch_index
from operatorx.backends.vllm.attention.support import module_choice, refusal
from operatorx.spec import Case
from tests.backends.vllm.cases import WorkspaceRecorder, prepare_and_check

GQA = {"hidden": 256, "q_heads": 8, "kv_heads": 2, "head_dim": 64, "rope_dim": 64, "rope_theta": 10000.0}
DECODE = [{"count": 4, "q": 1, "ctx": 100}]
PREFILL = [{"count": 2, "q": 33, "ctx": 0}, {"count": 2, "q": 33, "ctx": 50}]
MIXED = [{"count": 2, "q": 40, "ctx": 0}, {"count": 3, "q": 1, "ctx": 70}, {"count": 1, "q": 20, "ctx": 30}]
FP8 = {"dtype": "e4m3", "scale": {"dtype": "fp32", "group": [1, 128], "static": False}}
FP8_BLOCK_W = {"dtype": "e4m3", "scale": {"dtype": "fp32", "group": [128, 128], "static": True}}
#: Block FP8 on every projection, as an FP8 checkpoint (Qwen3-*-FP8) stores them.
FP8_PROJ = {name: {"a": FP8, "b": FP8_BLOCK_W} for name in ("q_proj", "k_proj", "v_proj", "o_proj")}


def _case(groups: list[dict[str, Any]], pages: str = "contiguous", **extra: Any) -> Case:
    args = {**GQA, **extra, "batch": {"groups": groups, "pages": pages, "seed": 5}}
    return Case.model_validate({"type": "gqa", "args": args, "sources": ["org/model/self_attn"]})


# --- CPU: no vLLM needed --------------------------------------------------------------------------------

@pytest.mark.parametrize(("extra", "cls"), [({}, "LlamaAttention"), ({"qk_norm": True}, "Qwen3Attention"),
                                            ({"qk_norm": True, "window": 64}, "Qwen3Attention"),
                                            ({"qk_norm": True, "gate": True}, "Qwen3NextAttention")])
def test_module_choice_by_form(extra, cls):
    choice = module_choice(_case(DECODE, **extra).args)
    assert not isinstance(choice, str) and choice.cls == cls
    assert choice.norm_offset is (cls == "Qwen3NextAttention")


@pytest.mark.parametrize(("extra", "words"), [
    ({"gate": True}, "gate without qk_norm"),
    ({"gate": True, "qk_norm": True, "window": 32}, "gate with window"),
    ({"proj": {"q_proj": {"a": FP8, "b": FP8}}}, "proj.q_proj: dynamic weight scales"),
    ({"proj": {"q_proj": {"a": FP8, "b": FP8_BLOCK_W}}}, "bf16 beside quantized projections"),
    ({"parallel": {"tp": 2}}, "multi-rank vLLM attention is not built"),
])
def test_refusals_name_their_field(extra, words):
    why = refusal(_case(DECODE, **extra).args)
    assert why is not None and words in why
    assert VllmGqa().supports(_case(DECODE, **extra), "cuda") == why


def test_cpu_device_is_refused():
    why = VllmGqa().supports(_case(DECODE), "cpu")
    assert why is not None and "cpu" in why


def test_batch_index_in_layout_order_without_a_threshold():
    layout = plan_layout(_case(PREFILL, pages="shuffled").args.batch)
    ix = batch_index(layout, None)
    assert ix.order == (0, 1, 2, 3) and not ix.reordered
    assert ix.query_start_loc.tolist() == [0, 33, 66, 99, 132]
    assert ix.seq_lens.tolist() == [33, 33, 83, 83] and ix.num_computed.tolist() == [0, 0, 50, 50]
    assert ix.max_query_len == 33 and ix.max_seq_len == 83
    assert ix.num_blocks == layout.pool_pages + RESERVED_BLOCKS
    assert ix.regions == ("prefill", "prefill", "long_extend", "long_extend")
    assert ix.is_prefilling.tolist() == [True] * 4
    for i, r in enumerate(layout.requests):                  # block p of the layout is vLLM's block p + 1
        blocks = ix.block_table[i].tolist()
        assert blocks[:len(r.pages)] == [p + 1 for p in r.pages]
        assert all(b == 0 for b in blocks[len(r.pages):])   # padded with the null block
    r = layout.requests[2]                                   # its first new token: position 50
    pos = r.ctx
    want = (r.pages[pos // PAGE_TOKENS] + 1) * PAGE_TOKENS + pos % PAGE_TOKENS
    assert int(ix.slot_mapping[66]) == want and int(ix.positions[66]) == 50
    assert ix.slot_mapping.dtype == torch.int64 and ix.block_table.dtype == torch.int32
    assert 0 <= int(ix.slot_mapping.min()) - PAGE_TOKENS and int(ix.slot_mapping.max()) < ix.num_blocks * PAGE_TOKENS
    assert ix.rows.tolist() == list(range(132))


def test_batch_index_puts_decodes_first_for_a_splitting_builder():
    layout = plan_layout(_case(MIXED).args.batch)
    ix = batch_index(layout, 1)
    assert ix.reordered
    assert ix.order == (2, 3, 4, 5, 0, 1)                   # decode -> long extend -> prefill, stable
    assert ix.regions == ("decode",) * 3 + ("long_extend", "prefill", "prefill")
    assert ix.region_counts() == {"decode": 3, "long_extend": 1, "prefill": 2}
    assert ix.is_prefilling.tolist() == [False] * 3 + [True] * 3
    decode_rows = [layout.requests[i].row0 for i in (2, 3, 4)]
    assert ix.rows[:3].tolist() == decode_rows             # batch token j is layout row rows[j]
    assert ix.positions[:3].tolist() == [70, 70, 70]
    assert sorted(ix.rows.tolist()) == list(range(layout.tokens))


def _fake_backend(rec: WorkspaceRecorder, fail: set[int]) -> Any:
    """A vllm attention backend whose n-th build (from 0) fails when n is in `fail`."""
    from operatorx.backends.vllm.attention.base import VllmAttentionBackend

    builds = iter(range(100))

    class Fake(VllmAttentionBackend):
        op_type = "gqa"

        def supports(self, case: Case, device: str) -> None:
            return None

        def build(self, case: Case, args: Any, stack: Any) -> Any:
            n = next(builds)
            stack.callback(rec.events.append, f"module {n} released")
            if n in fail:
                raise RuntimeError(f"build {n} failed")
            return rec

    return Fake()


@pytest.mark.parametrize("fails", [False, True], ids=["released", "failed-build"])
def test_the_workspace_goes_back_after_the_module(monkeypatch, fails):
    """vLLM's attention kernels grow one process-wide workspace (FlashMLA's V4 prefill gather, the sparse
    indexer): a case gives it back after its own teardown, on release or when its build fails."""
    from operatorx.backends.vllm.env import VllmEnv

    rec = WorkspaceRecorder()
    monkeypatch.setattr(VllmEnv, "get", classmethod(lambda cls: rec))
    backend = _fake_backend(rec, {0} if fails else set())
    if fails:
        with pytest.raises(RuntimeError, match="build 0 failed"):
            backend.prepare(_case(DECODE), "cuda")
    else:
        prepared = backend.prepare(_case(DECODE), "cuda")
        assert rec.events == []
        assert prepared.release is not None
        prepared.release()
    assert rec.events == ["module 0 released", "workspace dropped"]
    assert rec.workspace_holders == 0


def test_a_failed_copy_leaves_the_workspace_to_the_live_ones(monkeypatch):
    """--placements holds copies of one case together, their graphs replaying views of one workspace: a copy
    whose build fails must not free it under them; the last release does."""
    from operatorx.backends.vllm.env import VllmEnv

    rec = WorkspaceRecorder()
    monkeypatch.setattr(VllmEnv, "get", classmethod(lambda cls: rec))
    backend = _fake_backend(rec, {1})
    first = backend.prepare(_case(DECODE), "cuda")
    with pytest.raises(RuntimeError, match="build 1 failed"):
        backend.prepare(_case(DECODE), "cuda")
    assert rec.events == ["module 1 released"] and rec.workspace_holders == 1
    third = backend.prepare(_case(DECODE), "cuda")
    assert first.release is not None and third.release is not None
    first.release()
    assert "workspace dropped" not in rec.events
    third.release()
    third.release()                                           # a second release changes nothing
    assert rec.events == ["module 1 released", "module 0 released", "module 2 released", "workspace dropped"]
    assert rec.workspace_holders == 0

# --- GPU: vLLM's own module ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vllm_gqa():
    pytest.importorskip("vllm")
    return VllmGqa()


@pytest.mark.gpu
@pytest.mark.parametrize("extra", [{}, {"qk_norm": True}, {"qk_norm": True, "gate": True, "rope_dim": 32}],
                         ids=["llama", "qwen3", "qwen3next"])
def test_decode_matches_the_reference(vllm_gqa, extra):
    prepared, check = prepare_and_check(vllm_gqa, _case(DECODE, pages="shuffled", **extra))
    assert check.ok, check.to_json()
    meta = prepared.metadata
    assert meta["attention_backend"]["name"] and meta["attention_backend"]["class"].endswith("Backend")
    assert meta["metadata_builder"].endswith("MetadataBuilder")
    assert meta["requests"]["decode"] == 4 and meta["requests"]["prefill"] == 0
    assert meta["kv_cache"]["block_size"] == 16
    # eager layers dispatch vLLM's IR norms to its own kernels, as an uncompiled engine does
    assert meta["ir_op_priority"]["rms_norm"][0] == "vllm_c", meta["ir_op_priority"]
    # a graph decode gets the split budget the engine's capture sizes give FlashAttention (32, not 0)
    assert meta["cuda_graph"] is True
    if meta["attention_backend"]["name"] == "FLASH_ATTN":
        assert meta["max_num_splits"] == 32, meta["max_num_splits"]


@pytest.mark.gpu
@pytest.mark.parametrize("extra", [{}, {"qk_norm": True, "window": 40}], ids=["plain", "window"])
def test_prefill_matches_the_reference(vllm_gqa, extra):
    prepared, check = prepare_and_check(vllm_gqa, _case(PREFILL, pages="shuffled", **extra))
    assert check.ok, check.to_json()
    meta = prepared.metadata
    assert meta["attention_backend"]["name"]
    assert meta["requests"]["prefill"] == 2 and meta["requests"]["long_extend"] == 2
    assert meta["cuda_graph"] is False


@pytest.mark.gpu
def test_fp8_cache_decode(vllm_gqa):
    prepared, check = prepare_and_check(vllm_gqa, _case(DECODE, kv_cache_dtype="fp8", qk_norm=True))
    assert check.ok, check.to_json()
    assert prepared.metadata["kv_cache"]["dtype"] == "uint8"
    assert prepared.metadata["kv_cache"]["cache_dtype"] == "fp8"


@pytest.mark.gpu
def test_mixed_batch_and_mrope(vllm_gqa):
    prepared, check = prepare_and_check(vllm_gqa, _case(MIXED, qk_norm=True, mrope_section=[8, 12, 12]))
    assert check.ok, check.to_json()
    assert prepared.metadata["rotary_embedding"] == "MRotaryEmbedding"


@pytest.mark.gpu
@pytest.mark.parametrize("groups", [DECODE, MIXED], ids=["decode", "mixed"])
def test_block_fp8_projections(vllm_gqa, groups):
    prepared, check = prepare_and_check(vllm_gqa, _case(groups, qk_norm=True, proj=FP8_PROJ))
    assert check.ok, check.to_json()
    assert "fp8_block activations quantized with" in check.reference
    proj = prepared.metadata["projections"]
    assert proj["scheme"] == "fp8_block" and proj["quant_config"] == "Fp8Config"
    for name in ("qkv_proj", "o_proj"):
        assert proj["layers"][name]["quant_method"] == "Fp8LinearMethod", proj

