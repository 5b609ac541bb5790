"""The vllm dsv4_attn backend's CPU side: its refusals by field (and the shipped cases' ones), its one
DeepseekV4FP8Config projection plan, the 584-byte fp8_ds_mla token byte for byte, the caches' pages and
strides, which blocks each request holds, and the read-back into the reference's Dsv4Cached."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from operatorx.backends.torch.attention.dsv4_reference import ds_mla_round_trip, index_fp8_round_trip
from operatorx.backends.torch.attention.layout import plan_layout
from operatorx.backends.vllm.attention.batch import RESERVED_BLOCKS
from operatorx.backends.vllm.attention.dsv4_layout import (
    TOKEN_BYTES,
    allocate_cache,
    dsv4_cache_specs,
    pack_fp8_ds_mla,
    plan_caches,
    read_cached,
    read_fp8_ds_mla,
    split_state,
    unpack_fp8_ds_mla,
    write_fp8_ds_mla,
    write_rows,
)
from operatorx.backends.vllm.attention.dsv4_support import dsv4_padded_heads, dsv4_projection_plan, dsv4_refusal
from operatorx.backends.vllm.quant_map import _DSV4_CONFIG
from operatorx.spec import Case
from operatorx.spec.attention import Dsv4AttnArgs
from tests.backends.vllm.cases import SCHEMES

ATTN_SMALL = "src/operatorx/testlists/attn_small.json"
FP8_A, FP8_W = SCHEMES["fp8_block_ue8m0"]
FP8 = {"a": FP8_A, "b": FP8_W}
ALL_FP8 = {name: FP8 for name in ("wq_a", "wkv", "wq_b", "wo_a", "wo_b", "indexer.wq_b")}
YARN = {"type": "yarn", "factor": 16.0, "original_max": 65536, "beta_fast": 32.0, "beta_slow": 1.0}
#: DeepSeek-V4-Flash's ratio-4 attention, one rank of tp 4 (64 heads, 8 groups over 4 ranks).
FLASH_C4 = {"hidden": 4096, "heads": 16, "head_dim": 512, "rope_dim": 64, "q_lora_rank": 1024, "window": 128,
            "o_groups": 2, "o_lora_rank": 1024, "compress_ratio": 4, "indexer": "own", "topk": 512,
            "index_heads": 64, "index_dim": 128, "compress_rope_theta": 160000.0, "rope_scaling": YARN,
            "kv_cache_dtype": "fp8", "index_cache_dtype": "fp8", "proj": ALL_FP8}
NO_INDEXER = ("indexer", "topk", "index_heads", "index_dim", "index_cache_dtype")
DECODE = [{"count": 4, "q": 1, "ctx": 8192}]


def _args(groups: list[dict[str, Any]] = DECODE, drop: tuple[str, ...] = (), **extra: Any) -> Dsv4AttnArgs:
    data = {k: v for k, v in {**FLASH_C4, **extra}.items() if k not in drop}
    case = Case.model_validate({"type": "dsv4_attn", "args": {**data, "batch": {"groups": groups, "seed": 5}},
                                "sources": ["deepseek-ai/DeepSeek-V4-Flash/attn:c4"]})
    assert isinstance(case.args, Dsv4AttnArgs)
    return case.args


def _ratio(r: int, **extra: Any) -> Dsv4AttnArgs:
    """The Flash case at ratio r (0 or 128: no indexer, no indexer.wq_b; 0: no compress rope either)."""
    proj = {k: v for k, v in ALL_FP8.items() if k != "indexer.wq_b"}
    drop = NO_INDEXER + (("compress_rope_theta", "rope_scaling") if r == 0 else ())
    return _args(drop=drop, compress_ratio=r, proj=proj, **extra)


# --- refusals and the plan -------------------------------------------------------------------------------

def test_deepseek_v4_flash_runs_at_every_ratio_under_one_dsv4_fp8_plan():
    for args in (_args(), _ratio(128), _ratio(0)):
        assert dsv4_refusal(args) is None, args.compress_ratio
    plan = dsv4_projection_plan(_args())
    assert not isinstance(plan, str)
    assert (plan.scheme, plan.quant, plan.weight_scale_dtype) == ("fp8_block", _DSV4_CONFIG, "ue8m0")
    assert "indexer.wq_b" in plan.notes[-1] and "fused_wkv_wgate" in plan.notes[-1]
    fp32_a, fp32_w = SCHEMES["fp8_block"]
    fp32 = dsv4_projection_plan(_args(proj={k: {"a": fp32_a, "b": fp32_w} for k in ALL_FP8}))
    assert not isinstance(fp32, str) and fp32.weight_scale_dtype == "fp32"       # Flash-Base (expert_dtype fp8)
    assert [dsv4_padded_heads(h) for h in (8, 64, 65, 128)] == [64, 64, 128, 128]


BF16_PAIR = {"a": SCHEMES["bf16"][0], "b": SCHEMES["bf16"][1]}


@pytest.mark.parametrize(("extra", "drop", "words"), [
    ({"compress_ratio": 2}, NO_INDEXER, "compress_ratio=2: vLLM 0.26's DeepSeek-V4 compresses at ratios 4 and 128"),
    ({"compress_ratio": 1}, NO_INDEXER, "compress_ratio=1"),
    ({"compress_ratio": 2, "indexer": "shared"}, (), "indexer=shared"),
    ({"compress_ratio": 2, "indexer": "reuse"}, (), "indexer=reuse"),
    ({"source": False}, (), "source=false"),
    ({"index_cache_dtype": "mxfp4"}, (), "index_cache_dtype=mxfp4"),
    ({"kv_cache_dtype": "bf16"}, (), "kv_cache_dtype=bf16"),
    ({"kv_cache_dtype": "auto"}, (), "kv_cache_dtype=auto: vLLM 0.26's DeepSeek-V4 layer asserts an fp8 cache"),
    ({"head_dim": 256}, (), "head_dim=256"),
    ({"rope_dim": 32}, (), "rope_dim=32"),
    ({"index_dim": 64}, (), "index_dim=64"),
    ({"heads": 256}, (), "heads=256 on the rank"),
    ({"window": 100}, (), "window=100"),
    ({"topk": 500}, (), "topk=500"),
    ({"o_lora_rank": 1000}, (), "o_lora_rank=1000"),
    ({"proj": {k: v for k, v in ALL_FP8.items() if k != "wo_a"}}, (), "proj.wo_a bf16 (absent from proj)"),
    ({"proj": {}}, (), "proj.wo_a bf16"),
    ({"proj": {k: v for k, v in ALL_FP8.items() if k != "wq_b"}}, (), "proj.wq_b bf16 beside block-FP8 wo_a"),
    ({"proj": {k: v for k, v in ALL_FP8.items() if k != "indexer.wq_b"}}, (), "proj.indexer.wq_b bf16"),
    ({"proj": {**ALL_FP8, "wq_a": {"a": SCHEMES["fp8_tensor_static"][0], "b": SCHEMES["fp8_tensor_static"][1]}}}, (),
     "proj.wq_a: fp8_tensor_static"),
    ({"proj": {**ALL_FP8, "wkv": {"a": SCHEMES["fp8_block"][0], "b": SCHEMES["fp8_block"][1]}}}, (),
     "proj: weight scales in ['fp32', 'ue8m0']"),
    ({"proj": {k: {"a": SCHEMES["fp8_block_bf16scale"][0], "b": SCHEMES["fp8_block_bf16scale"][1]}
               for k in ALL_FP8}}, (), "proj: weight scales in ['bf16']"),
    ({"proj": {**ALL_FP8, "compressor.wkv": FP8}}, (), "proj.compressor.wkv: fp8_block"),
    ({"proj": {**ALL_FP8, "indexer.weights_proj": FP8}}, (), "proj.indexer.weights_proj: fp8_block"),
    ({"selection": "uniform"}, (), "selection=uniform"),
    ({"parallel": {"tp": 2}}, (), "multi-rank vLLM attention is not built"),
])
def test_refusals_name_their_field(extra, drop, words):
    why = dsv4_refusal(_args(drop=drop, **extra))
    assert why is not None and words in why, why
    assert "\n" not in why


def test_another_op_type_is_refused():
    mla = Case.model_validate({"type": "mla", "args": {
        "hidden": 64, "heads": 2, "q_lora_rank": 32, "kv_lora_rank": 16, "nope": 16, "rope_dim": 8, "v": 16,
        "rope_theta": 1e4, "batch": {"groups": DECODE}}, "sources": ["org/model/self_attn"]})
    assert "the vllm dsv4_attn backend runs dsv4_attn only" in (dsv4_refusal(mla.args) or "")


def _shipped() -> list[Case]:
    with open(ATTN_SMALL) as f:
        rows = [Case.model_validate(raw) for raw in json.load(f) if raw["type"] == "dsv4_attn"]
    assert rows
    return rows


def test_every_shipped_case_runs_but_for_the_mxfp4_index_cache_and_a_bf16_wo_a_is_refused_first():
    """The rows' rank shards run but the MXFP4 index cache; with wo_a out of proj (bf16, as upstream writes
    the cases) the wo_a gap is named instead."""
    for case in _shipped():
        args = case.args
        assert isinstance(args, Dsv4AttnArgs)
        assert "multi-rank" in (dsv4_refusal(args) or "")
        shard, _ = args.rank_shard(case.sources)
        assert isinstance(shard, Dsv4AttnArgs) and (shard.heads, shard.o_groups) == (16, 2)
        mxfp4 = shard.index_cache_dtype == "mxfp4"
        why = dsv4_refusal(shard)
        assert (why or "").startswith("index_cache_dtype=mxfp4") if mxfp4 else why is None, why
        bare = shard.model_copy(update={"proj": {k: v for k, v in (shard.proj or {}).items() if k != "wo_a"}})
        if not mxfp4:
            assert (dsv4_refusal(bare) or "").startswith("proj.wo_a bf16 (absent from proj)")


# --- the fp8_ds_mla token ------------------------------------------------------------------------------

def _hand_row() -> torch.Tensor:
    row = torch.zeros(512)
    row[0], row[1] = 3.0, 1.0                 # block 0: amax 3 -> scale 2^-7 (byte 120): 384 -> 0x7C, 128 -> 0x70
    row[128] = -56.0                          # block 2: amax 56 = 448 · 2^-3 exactly (byte 124): -448 -> 0xFE
    row[448], row[449] = 1.0, -2.0            # rope, bf16: 0x3F80, 0xC000
    return row.to(torch.bfloat16)


def test_a_hand_built_token_has_vllms_bytes():
    token = pack_fp8_ds_mla(_hand_row()[None])[0]
    assert token.shape == (TOKEN_BYTES,) and token.dtype == torch.uint8
    expected = torch.zeros(TOKEN_BYTES, dtype=torch.uint8)
    expected[0], expected[1], expected[128] = 0x7C, 0x70, 0xFE
    expected[448:452] = torch.tensor([0x80, 0x3F, 0x00, 0xC0], dtype=torch.uint8)
    # scales: blocks 1, 3..6 all zero -> the 1e-4 floor: ceil(log2(1e-4 / 448)) = -22 -> 105; the 8th byte 0
    expected[576:584] = torch.tensor([120, 105, 124, 105, 105, 105, 105, 0], dtype=torch.uint8)
    assert torch.equal(token, expected)
    assert torch.equal(unpack_fp8_ds_mla(token[None])[0], _hand_row().float())


def test_pack_unpack_round_trips_within_e4m3_and_is_the_references_rounding():
    gen = torch.Generator().manual_seed(0)
    rows = (torch.randn(37, 512, generator=gen) * torch.logspace(-3, 2, 37)[:, None]).to(torch.bfloat16)
    back = unpack_fp8_ds_mla(pack_fp8_ds_mla(rows))
    assert torch.equal(back[:, 448:], rows[:, 448:].float())                 # rope exact
    nope, got = rows[:, :448].float().view(37, 7, 64), back[:, :448].view(37, 7, 64)
    scale = torch.exp2(torch.ceil(torch.log2(nope.abs().amax(-1, keepdim=True) / 448)))
    # e4m3: 3 mantissa bits (half-ulp 2^-4 relative), subnormals below 2^-6 · scale (half-ulp 2^-10 · scale)
    assert bool(((got - nope).abs() <= nope.abs() * 2**-4 + scale * 2**-10).all())
    assert (got != nope).any()                                              # it did quantize
    assert torch.equal(back, ds_mla_round_trip(rows.float(), 64))           # R's reference rounds the same


def test_tokens_sit_where_vllm_puts_them_in_a_padded_block():
    (swa, *_) = dsv4_cache_specs(_ratio(0))
    cache = allocate_cache(swa, 3, "cpu")
    assert cache.shape == (3, 64, 584) and cache.stride() == (37440, 584, 1)
    rows = torch.randn(2, 512, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    slots = torch.tensor([64 + 5, -1])                                       # block 1, offset 5; a skipped pad
    write_fp8_ds_mla(cache, slots, rows)
    raw = torch.empty(0, dtype=torch.uint8).set_(cache.untyped_storage())
    packed = pack_fp8_ds_mla(rows[:1])[0]
    block = 37440
    assert torch.equal(raw[block + 5 * 576:block + 6 * 576], packed[:576])
    assert torch.equal(raw[block + 64 * 576 + 5 * 8:block + 64 * 576 + 6 * 8], packed[576:])
    touched = torch.zeros_like(raw, dtype=torch.bool)
    touched[block + 5 * 576:block + 6 * 576] = True
    touched[block + 64 * 576 + 5 * 8:block + 64 * 576 + 6 * 8] = True
    assert not raw[~touched].any()                                           # nothing else, the page pad untouched
    assert torch.equal(read_fp8_ds_mla(cache, slots[:1])[0], packed)


# --- the caches' pages and blocks --------------------------------------------------------------------------

def test_each_ratio_has_its_caches_pages_and_strides():
    got = {r: [(s.kind, s.block_tokens, s.stored, s.shape(1)[1:], s.dtype, s.real_page_bytes, s.page_bytes,
                s.page_stride) for s in dsv4_cache_specs(a)] for r, a in ((0, _ratio(0)), (128, _ratio(128)),
                                                                         (4, _args()))}
    u8, f32 = torch.uint8, torch.float32
    swa = ("swa", 64, 64, (64, 584), u8, 37376, 37440, 37440)
    assert got[0] == [swa]
    assert got[128] == [swa, ("main", 256, 2, (2, 584), u8, 1168, 1728, 1728),
                        ("state", 8, 8, (8, 1024), f32, 32768, 32832, 8208)]
    assert got[4] == [swa, ("main", 256, 64, (64, 584), u8, 37376, 37440, 37440),
                      ("state", 4, 4, (4, 2048), f32, 32768, 32832, 8208),
                      ("index_keys", 256, 64, (64, 132), u8, 8448, 8640, 8640),
                      ("index_state", 4, 4, (4, 512), f32, 8192, 8640, 2160)]
    names = [s.layer_name("operatorx.layers.3.attn") for s in dsv4_cache_specs(_args())]
    assert names == ["operatorx.layers.3.attn.swa_cache", "operatorx.layers.3.attn",
                     "operatorx.layers.3.attn.compressor.state_cache", "operatorx.layers.3.attn.indexer.k_cache",
                     "operatorx.layers.3.attn.indexer.compressor.state_cache"]


def test_window_caches_hold_only_the_last_window_and_map_the_rest_to_the_null_block():
    args = _args([{"count": 1, "q": 1, "ctx": 8192}, {"count": 1, "q": 300, "ctx": 0}])
    layout = plan_layout(args.batch, args.window)
    plans = plan_caches(args, layout)
    swa, main, state = plans.plans["swa"], plans.plans["main"], plans.plans["state"]
    table = swa.block_table((0, 1))
    assert table.shape == (2, 129)                                            # ceil(8193 / 64)
    assert not table[0, :126].any() and bool((table[0, 126:] > 0).all())     # (8192 - 127) // 64 = 126 null
    assert swa.pool_blocks == 3 + 5 and swa.num_blocks == 9                  # + ceil(300 / 64), + the null block
    assert swa.fill_slots(0).numel() == 127 and swa.fill_slots(1).numel() == 0
    held = set(table[table > 0].tolist())
    assert held == set(range(RESERVED_BLOCKS, swa.num_blocks))
    assert state.block_table((0,))[0, :2046].eq(0).all() and state.pool_blocks == 3 + 75
    assert state.fill_slots(0).numel() == 7                                  # coff · 4 - 1 positions
    assert main.requests[0].ctx == 2048 and main.requests[0].page_tokens == 64 and main.pool_blocks == 33 + 2
    # where this step writes: the decode's position 8192 is no boundary; the prefill's 3, 7, .., 299 are
    comp = plans.slot_mapping("main", (0, 1))
    assert comp[0] == -1 and int((comp[1:] >= 0).sum()) == 75
    first = main.block_table((1,))[0, 0]
    assert comp[1:][3::4].tolist() == [int(first) * 64 + e for e in range(64)] + [
        int(main.block_table((1,))[0, 1]) * 64 + e for e in range(11)]
    new = plans.slot_mapping("swa", (1, 0))
    assert new[-1] == int(table[0, 128]) * 64 + 0                            # position 8192: block 128, offset 0


def test_shuffled_blocks_are_a_permutation_of_each_pool():
    args = _args([{"count": 6, "q": 1, "ctx": 700}])
    args = args.model_copy(update={"batch": args.batch.model_copy(update={"pages": "shuffled"})})
    plans = plan_caches(args, plan_layout(args.batch, args.window))
    for plan in plans.plans.values():
        ids = plan.block_table(tuple(range(6)))
        held = ids[ids > 0]
        assert sorted(held.tolist()) == list(range(1, plan.num_blocks)), plan.spec.kind
    assert plans.plans["main"].block_table((0,))[0].tolist() != [1, 2, 3]


def test_filled_caches_read_back_as_the_reference_expects():
    args = _args([{"count": 1, "q": 2, "ctx": 300}, {"count": 1, "q": 5, "ctx": 0}, {"count": 1, "q": 1, "ctx": 41}],
                 window=128)
    layout = plan_layout(args.batch, args.window)
    plans = plan_caches(args, layout)
    gen = torch.Generator().manual_seed(7)
    caches, written = {}, {}
    for kind, plan in plans.plans.items():
        caches[kind] = allocate_cache(plan.spec, plan.num_blocks, "cpu")
        for i, own in enumerate(plan.requests):
            width = {"index_keys": 128, "swa": 512, "main": 512}.get(kind, plan.spec.width)
            rows = torch.randn(own.ctx - own.key_start, width, generator=gen)
            rows = rows.to(torch.bfloat16) if kind in ("swa", "main", "index_keys") else rows
            write_rows(caches[kind], plan, i, rows)
            written[kind, i] = rows
    cached = read_cached(args, plans, caches)
    expect = {"swa": lambda t: ds_mla_round_trip(t.float(), 64), "main": lambda t: ds_mla_round_trip(t.float(), 64),
              "index_keys": lambda t: index_fp8_round_trip(t.float()), "state": lambda t: t,
              "index_state": lambda t: t}
    readers = {"swa": cached.window, "main": cached.compressed, "state": cached.state,
               "index_keys": cached.index_keys, "index_state": cached.index_state}
    for (kind, i), rows in written.items():
        reader = readers[kind]
        assert reader is not None
        got = reader(layout.requests[i])
        if rows.shape[0] == 0:                    # a ctx-0 request (the reference's round trips take n > 0)
            assert got.shape == rows.shape and got.dtype == torch.float32, (kind, i)
            continue
        assert torch.equal(got, expect[kind](rows)), (kind, i)
    r300 = layout.requests[0]
    assert cached.window(r300).shape == (127, 512)                           # positions 173 .. 299
    assert cached.compressed is not None and cached.compressed(r300).shape == (75, 512)
    assert cached.state is not None and cached.state(r300).shape == (7, 2048)
    assert cached.state(layout.requests[1]).shape == (0, 2048)               # ctx 0
    kv, score = split_state(cached.state(r300))
    assert kv.shape == score.shape == (7, 1024)


@pytest.mark.parametrize(("captured", "size", "error", "mode", "words"), [
    (True, 16, None, "full", "CUDA-graph replay of the whole forward; serving: one FULL graph"),
    (True, 24, None, "full", "pad T=20 to 24"),
    (False, 16, None, "eager", "serving: the breakable cudagraph in PIECEWISE mode"),
    (False, None, None, "eager", "serving: eager too (above the largest capture size"),
    (False, 16, "RuntimeError: capture", "eager", "the capture failed; serving: one FULL graph"),
])
def test_the_row_says_how_it_was_timed_and_how_serving_runs_it(captured, size, error, mode, words):
    """A uniform decode is one FULL graph in serving (the breakable cudagraph does not break in FULL mode), so it
    is timed as a replay; another batch runs PIECEWISE there within the capture sizes and eagerly above them,
    and is timed eagerly here."""
    from operatorx.backends.vllm.attention.dsv4_meta import UPSTREAM_GRAPH, graph_record

    rec = graph_record(captured, size, 16 if size != 24 else 20, error)
    assert rec["graph_mode"] == mode and words in rec["graph_note"], rec
    assert rec["graph_note"].endswith(UPSTREAM_GRAPH)
    assert rec.get("graph_error") == error
    assert ("pad" in rec["graph_note"]) is (size == 24)


def test_the_check_says_vllms_own_top_k_only_at_ratio_4():
    from operatorx.backends.vllm.attention.dsv4 import VllmDsv4

    backend = VllmDsv4()
    assert backend.cache_read(_args()).endswith("attention over vLLM's own top-k (topk_indices_buffer)")
    for r in (128, 0):                        # every compressed entry; the window alone
        assert "top-k" not in backend.cache_read(_ratio(r)), r
