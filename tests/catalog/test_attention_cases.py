"""Attention cases from the catalog (catalog/attention_cases.py): the module's fields from the config, the
decode and prefill batches, the split, the context the model holds, and a note where a fact is missing."""

from __future__ import annotations

import dataclasses
import json

from operatorx.catalog.attention_cases import attention_cases
from operatorx.catalog.checkpoints import find_checkpoints
from operatorx.catalog.testlists import ATTN_SMALL_DECODE, ATTN_SMALL_PREFILL, build_shipped


def _ckpt(model_id: str):
    (ckpt,) = find_checkpoints([model_id])
    return ckpt


def test_qwen3_moe_attention_is_gqa_with_qk_norm_over_each_batch():
    ckpt = _ckpt("Qwen/Qwen3-30B-A3B-Base")
    name, roles = next(iter(ckpt.schemes.items()))
    notes: list[str] = []
    cases = attention_cases(ckpt.arch, roles, ckpt.source_id(name), 2, notes, [(64, 8192)], [(2048, 0)])
    assert notes == [] and [c.type for c in cases] == ["gqa", "gqa"]
    decode, prefill = (c.args for c in cases)
    # config.json: 32 q heads, 4 kv heads, head_dim 128, rope_theta 1e6; Qwen3Attention's q/k RMS norms
    assert (decode.q_heads, decode.kv_heads, decode.head_dim, decode.rope_dim) == (32, 4, 128, 128)
    assert decode.rope_theta == 1e6 and decode.qk_norm and decode.hidden == 2048
    assert decode.parallel is not None and decode.parallel.tp == 2
    g = decode.batch.groups[0]
    assert (g.count, g.q, g.ctx) == (64, 1, 8192)
    g = prefill.batch.groups[0]
    assert (g.count, g.q, g.ctx) == (1, 2048, 0)
    assert cases[0].sources == [f"{ckpt.source_id(name)}/self_attn"]


def test_deepseek_mla_at_tp1_has_no_split_and_long_contexts_past_the_model_are_left_out():
    ckpt = _ckpt("deepseek-ai/DeepSeek-V3")
    name, roles = next(iter(ckpt.schemes.items()))
    longest = 163840                                  # DeepSeek-V3's config.json max_position_embeddings
    arch = dataclasses.replace(ckpt.arch, config={**ckpt.arch.config, "max_position_embeddings": longest})
    cases = attention_cases(arch, roles, ckpt.source_id(name), 1, [], [(1, longest), (1, longest - 1)],
                            [(longest, 1)])
    assert len(cases) == 1 and cases[0].type == "mla" and cases[0].args.parallel is None
    args = cases[0].args
    assert (args.heads, args.kv_lora_rank, args.nope, args.rope_dim, args.v) == (128, 512, 128, 64, 128)
    assert args.batch.groups[0].ctx == longest - 1 and args.rope_scaling is not None


def test_a_checkpoint_without_rope_theta_gets_no_case_and_a_note_naming_the_field():
    for ckpt in find_checkpoints(None):
        if ckpt.arch.opt("rope_theta") is None and ckpt.arch.attention != "dsv4":
            break
    name, roles = next(iter(ckpt.schemes.items()))
    notes: list[str] = []
    assert attention_cases(ckpt.arch, roles, ckpt.source_id(name), 1, notes, [(1, 1024)], []) == []
    assert len(notes) == 1 and "rope_theta" in notes[0] and ckpt.id in notes[0]


def test_attn_small_holds_every_derivable_checkpoints_module_over_its_batches():
    cases = build_shipped()["attn_small"]
    by_source: dict[str, list] = {}
    for c in cases:
        by_source.setdefault(c.sources[0], []).append(c)
    assert by_source, "attn_small is empty"
    per_module = len(ATTN_SMALL_DECODE) + len(ATTN_SMALL_PREFILL)
    for source, group in by_source.items():
        # DeepSeek-V4's own-indexer layers are one module per index-key cache (fp8, mxfp4)
        caches = {getattr(c.args, "index_cache_dtype", None) for c in group}
        assert len(group) == per_module * len(caches), source
        assert {c.type for c in group} <= {"gqa", "mla", "mla_dsa", "gdn", "dsv4_attn"}
    pro = "deepseek-ai/DeepSeek-V4-Pro/attn"
    assert sorted(s for s in by_source if s.startswith(pro)) == [f"{pro}:c128", f"{pro}:c4"]
    assert sorted({c.args.index_cache_dtype for c in by_source[f"{pro}:c4"]}) == ["fp8", "mxfp4"]
    assert json.loads(json.dumps([c.to_json() for c in cases]))     # serializable as shipped


def test_generate_with_attention_adds_every_batch_at_every_deployed_tp():
    from operatorx.catalog import generate

    cases = generate(["Qwen/Qwen3-30B-A3B-Base"], ms=[1], attention=True)
    gqa = [c for c in cases if c.type == "gqa"]
    # 4 request counts x 4 contexts + 3 prefill chunks, at TP 1 and 2 (the catalog's deployed TPs)
    assert len(gqa) == (4 * 4 + 3) * 2
    assert sorted({c.args.parallel.tp if c.args.parallel else 1 for c in gqa}) == [1, 2]
    assert not [c for c in generate(["Qwen/Qwen3-30B-A3B-Base"], ms=[1]) if c.type == "gqa"]
