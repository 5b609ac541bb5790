"""The vllm gdn / kda backends: refusals, the state slots and the runner-style state buffer on the CPU; gdn and kda
decode, prefill and mixed batches through vLLM's own modules on a GPU (the `gpu` tests skip without CUDA or vLLM)."""

from __future__ import annotations

from contextlib import ExitStack
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from operatorx.backends.vllm.attention.batch import batch_index
from operatorx.backends.vllm.attention.linear import VllmGdn, VllmKda, check_linear
from operatorx.backends.vllm.attention.linear_build import allocate_states, state_views
from operatorx.backends.vllm.attention.linear_layout import batch_state_indices, state_layout, state_slots
from operatorx.backends.vllm.attention.linear_support import KDA_GATE, build_refusal, linear_refusal
from operatorx.spec import Case
from tests.backends.vllm.cases import prepare_and_check

GDN = {"hidden": 512, "qk_heads": 2, "v_heads": 4, "head_dim": 128, "conv_kernel": 4}
KDA = {"hidden": 512, "heads": 4, "head_dim": 128, "conv_kernel": 4}
DECODE = [{"count": 8, "q": 1, "ctx": 100}]
MIXED = [{"count": 2, "q": 40, "ctx": 0}, {"count": 3, "q": 1, "ctx": 70}, {"count": 1, "q": 70, "ctx": 30}]
FP8 = {"dtype": "e4m3", "scale": {"dtype": "fp32", "group": [1, 128], "static": False}}
FP8_W = {"dtype": "e4m3", "scale": {"dtype": "fp32", "group": [128, 128], "static": True}}


#: Not registered in backends/names.py: on the H200 (benchmarks §29) the gdn decode ran eagerly where vLLM would
#: replay a graph (the process config's max_cudagraph_capture_size is 0, so the GDN builder's
#: decode_cudagraph_max_bs is 0), and the mixed-batch and kda tests had not finished when their run timed out.


def _case(kind: str, groups: list[dict[str, Any]], pages: str = "contiguous", **extra: Any) -> Case:
    args = {**(GDN if kind == "gdn" else KDA), **extra, "batch": {"groups": groups, "pages": pages, "seed": 3}}
    return Case.model_validate({"type": kind, "args": args, "sources": ["org/model/linear_attn"]})


# --- CPU: no vLLM needed --------------------------------------------------------------------------------

@pytest.mark.parametrize(("kind", "extra", "words"), [
    ("gdn", {"parallel": {"tp": 2}}, "multi-rank vLLM attention is not built"),
    ("gdn", {"proj": {"in_proj_qkv": {"a": FP8, "b": FP8_W}}}, "proj.in_proj_qkv.a: e4m3"),
    ("gdn", {"head_dim": 512}, "head_dim=512"),
    ("kda", {"conv_kernel": 6}, "conv_kernel=6"),
    ("kda", {"gate_rank": 64}, "gate_rank=64"),
    ("kda", {"state_dtype": "bf16"}, "state_dtype=bf16"),
])
def test_refusals_name_their_field(kind, extra, words):
    case = _case(kind, DECODE, **extra)
    why = linear_refusal(case.args)
    assert why is not None and words in why
    backend = VllmGdn() if kind == "gdn" else VllmKda()
    assert backend.supports(case, "cuda") == why


@pytest.mark.parametrize("extra", [{}, {"norm_act": "sigmoid"}, {"state_dtype": "bf16"}])
def test_gdn_forms_vllm_builds_are_accepted(extra):
    assert linear_refusal(_case("gdn", MIXED, **extra).args) is None


def test_every_kda_case_is_refused_for_its_full_rank_output_gate_but_vllm_can_build_the_module():
    for extra in ({}, {"gate_rank": 128}):
        args = _case("kda", MIXED, **extra).args
        assert linear_refusal(args) == KDA_GATE and "g_a_proj" in KDA_GATE
        assert build_refusal(args) is None


def test_the_split_counts_the_prefills_that_start_from_a_state_not_the_decodes():
    """GDN metadata flags every sequence in has_initial_state (decodes with a cache too) and the prefills alone
    in prefill_has_initial_state: 3 decodes and 3 prefills, one of them after cached tokens."""
    from types import SimpleNamespace

    from operatorx.backends.vllm.attention.linear_meta import split_of

    md = SimpleNamespace(num_decodes=3, num_prefills=3, has_initial_state=torch.tensor([1, 1, 1, 0, 0, 1]).bool(),
                         prefill_has_initial_state=torch.tensor([0, 0, 1]).bool())
    split = split_of(md)
    assert (split["num_decodes"], split["num_prefills"], split["prefills_with_initial_state"]) == (3, 3, 1)
    assert split_of(SimpleNamespace(num_decodes=2))["prefills_with_initial_state"] is None


def test_other_op_types_and_the_cpu_device_are_refused():
    gqa = Case.model_validate({"type": "gqa", "args": {"hidden": 64, "q_heads": 2, "kv_heads": 1, "head_dim": 32,
                                                       "rope_dim": 32, "rope_theta": 1e4,
                                                       "batch": {"groups": DECODE}}})
    assert "runs gdn and kda" in (linear_refusal(gqa.args) or "")
    why = VllmGdn().supports(_case("gdn", DECODE), "cpu")
    assert why is not None and "cpu" in why


@pytest.mark.parametrize("pages", ["contiguous", "shuffled"])
def test_each_request_holds_one_state_block_past_the_null_block(pages):
    layout = state_layout(_case("gdn", MIXED, pages=pages).args.batch)
    slots = state_slots(layout)
    assert layout.page_tokens == 100 and all(len(r.pages) == 1 for r in layout.requests)
    assert sorted(slots.tolist()) == list(range(1, len(layout.requests) + 1))
    if pages == "contiguous":
        assert slots.tolist() == list(range(1, 7))
    index = batch_index(layout, 1)
    assert index.regions == ("decode",) * 3 + ("long_extend", "prefill", "prefill")
    assert index.num_blocks == len(layout.requests) + 1
    want = [int(slots[i]) for i in index.order]
    assert batch_state_indices(index).tolist() == want
    assert index.query_start_loc.tolist() == [0, 1, 2, 3, 73, 113, 153]
    assert index.num_computed.tolist() == [70, 70, 70, 30, 0, 0]


def test_the_state_buffer_pages_each_block_conv_then_ssm_as_the_runner_does():
    spec = SimpleNamespace(shapes=((3, 16), (2, 4, 4)), dtypes=(torch.bfloat16, torch.float32),
                           page_size_bytes=3 * 16 * 2 + 2 * 4 * 4 * 4)
    raw, (conv, ssm) = allocate_states(spec, 5, device="cpu")
    assert raw.numel() == 5 * spec.page_size_bytes
    assert conv.shape == (5, 3, 16) and ssm.shape == (5, 2, 4, 4)
    assert conv.stride()[0] * 2 == spec.page_size_bytes and ssm.stride()[0] * 4 == spec.page_size_bytes
    conv[2] = 1.0
    ssm[2] = 2.0
    page = raw.view(torch.uint8)[2 * spec.page_size_bytes:3 * spec.page_size_bytes]
    assert torch.equal(page[:96].view(torch.bfloat16), torch.ones(48, dtype=torch.bfloat16))
    assert torch.equal(page[96:].view(torch.float32), torch.full((32,), 2.0))
    assert int(raw.view(torch.uint8).count_nonzero()) == int(page.count_nonzero())      # other blocks untouched
    snapshot = raw.clone()
    ssm[2] = 0.0
    views = state_views(snapshot, [conv, ssm])
    assert float(views[1][2].sum()) == 64.0 and float(ssm[2].sum()) == 0.0


# --- GPU: vLLM's own modules ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vllm_gdn():
    pytest.importorskip("vllm")
    return VllmGdn()


def _recorded(meta: dict[str, Any], cls: str) -> None:
    assert meta["module"].endswith(cls)
    assert meta["attention_backend"]["class"] == "GDNAttentionBackend"
    assert meta["metadata_builder"] == "GDNAttentionMetadataBuilder" and meta["metadata"] == "GDNAttentionMetadata"
    assert meta["state"]["mamba_cache_mode"] == "none" and len(meta["state"]["tensors"]) == 2


@pytest.mark.gpu
def test_gdn_decode_is_a_graph_and_matches_the_reference(vllm_gdn):
    prepared, check = prepare_and_check(vllm_gdn, _case("gdn", DECODE, pages="shuffled"))
    assert check.ok, check.to_json()
    meta = prepared.metadata
    _recorded(meta, "QwenGatedDeltaNetAttention")
    assert meta["requests"]["builder_split"]["num_decodes"] == 8
    assert meta["state"]["dtypes"] == ["bfloat16", "float32"]
    assert meta["cuda_graph"] is True, (meta.get("graph_error"), meta.get("graph_decision"), meta.get("cudagraph_mode"))


@pytest.mark.gpu
@pytest.mark.parametrize("extra", [{}, {"norm_act": "sigmoid", "state_dtype": "bf16"}])
def test_gdn_mixed_batch_matches_the_reference(vllm_gdn, extra):
    prepared, check = prepare_and_check(vllm_gdn, _case("gdn", MIXED, pages="shuffled", **extra))
    assert check.ok, check.to_json()
    meta = prepared.metadata
    _recorded(meta, "QwenGatedDeltaNetAttention")
    split = meta["requests"]["builder_split"]
    assert (split["num_decodes"], split["num_prefills"], split["prefills_with_initial_state"]) == (3, 3, 1)
    assert meta["cuda_graph"] is False


@pytest.mark.gpu
@pytest.mark.parametrize("groups", [DECODE, MIXED])
def test_kda_module_matches_the_reference(groups):
    pytest.importorskip("vllm")
    from operatorx.backends.vllm.attention.linear_build import build_linear

    case = _case("kda", groups, pages="shuffled")
    with ExitStack() as stack:
        built = build_linear(case, case.args, stack)  # type: ignore[arg-type]
        check = check_linear(case.args, built, built.timed)  # type: ignore[arg-type]
        assert check.ok, check.to_json()
        _recorded(built.metadata, "KimiGatedDeltaNetAttention")
        assert built.metadata["state"]["dtypes"] == ["bfloat16", "float32"]
        assert built.metadata["cuda_graph"] is (groups is DECODE), built.metadata.get("graph_error")
