"""Attention facts the catalog now holds (rope_theta, rope_scaling, sliding windows), and what the
derivation does with a fact its case type cannot hold: metadata when only RoPE's frequencies change,
a window case for sliding layers the config names, NotDerived for attention sinks."""

from __future__ import annotations

from operatorx.catalog.arch import read_arch
from operatorx.catalog.attention_cases import attention_cases
from operatorx.catalog.checkpoints import find_checkpoints
from operatorx.catalog.serving import Scenario, scenario_cases
from operatorx.catalog.serving_attention import sliding_layers


def _ckpt(model_id: str):
    (ckpt,) = find_checkpoints([model_id])
    return ckpt


def _cases(ckpt, arch=None, decode=((16, 8192),), prefill=(), tp=1):
    name, roles = next(iter(ckpt.schemes.items()))
    notes: list[str] = []
    cases = attention_cases(arch or ckpt.arch, roles, ckpt.source_id(name), tp, notes, decode, prefill)
    return cases, notes


def _rearch(ckpt, **facts):
    """The checkpoint's arch with config facts replaced (None drops the key)."""
    config = {k: v for k, v in {**ckpt.arch.config, **facts}.items() if v is not None}
    return read_arch(config, ckpt.arch.origin, dict(ckpt.arch.implementation))


def test_llama_3_1_8b_is_gqa_and_its_llama3_scaling_is_kept_as_metadata():
    # maxtext llama31_8b_config: 32 q / 8 kv heads, head_dim 128, rope_theta 500000, llama3 factor 8
    cases, notes = _cases(_ckpt("meta-llama/Llama-3.1-8B-Instruct"))
    assert notes == [] and [c.type for c in cases] == ["gqa"]
    a = cases[0].args
    assert (a.q_heads, a.kv_heads, a.head_dim, a.rope_dim, a.rope_theta) == (32, 8, 128, 128, 500000.0)
    assert not a.qk_norm and a.window is None
    note = cases[0].metadata["rope_scaling_not_in_case"]
    assert note.startswith("llama3 factor 8 (") and "RoPE frequencies differ, the work does not" in note
    assert cases[0].to_json()["metadata"] == {"rope_scaling_not_in_case": note}


def test_qwen3_32b_gqa_with_qk_norm_and_its_40k_context():
    # maxtext qwen3_32b_config: 64 q / 8 kv heads, head_dim 128, rope_theta 1e6, max_position_embeddings 40960
    cases, notes = _cases(_ckpt("Qwen/Qwen3-32B"), decode=((1, 32768), (1, 131072)))
    assert notes == [] and len(cases) == 1 and cases[0].args.batch.groups[0].ctx == 32768
    a = cases[0].args
    assert (a.q_heads, a.kv_heads, a.head_dim, a.rope_theta, a.qk_norm) == (64, 8, 128, 1e6, True)
    assert cases[0].metadata == {}


def test_mixtral_null_sliding_window_is_full_attention():
    # maxtext mixtral_8x22b_dict: 48 q / 8 kv heads, hidden 6144 (head_dim 128), rope_theta 1e6, sliding_window null
    cases, notes = _cases(_ckpt("mistralai/Mixtral-8x22B-v0.1"))
    assert notes == []
    a = cases[0].args
    assert (a.q_heads, a.kv_heads, a.head_dim, a.rope_theta, a.window) == (48, 8, 128, 1e6, None)


def test_kimi_k2_mla_carries_its_yarn_scaling():
    # Kimi-K2-Instruct config.json: 64 heads, rope_theta 50000, yarn factor 32, beta_fast 1, original 4096
    cases, notes = _cases(_ckpt("moonshotai/Kimi-K2-Instruct"), tp=8)
    assert notes == [] and cases[0].type == "mla"
    a = cases[0].args
    assert (a.heads, a.q_lora_rank, a.kv_lora_rank, a.rope_dim, a.rope_theta) == (64, 1536, 512, 64, 50000.0)
    s = a.rope_scaling
    assert (s.factor, s.original_max, s.beta_fast, s.beta_slow) == (32.0, 4096, 1.0, 1.0)


def test_gpt_oss_attention_sinks_are_not_derived_and_the_note_says_why():
    for model in ("openai/gpt-oss-20b", "openai/gpt-oss-120b"):
        cases, notes = _cases(_ckpt(model))
        assert cases == [] and len(notes) == 1
        assert "attention sinks are not in the gqa case format" in notes[0] and model in notes[0]


def test_sliding_layers_the_config_names_get_a_window_case_with_their_own_source():
    # gpt-oss-20b's layers (12 sliding at window 128, 12 full), as a model without sinks
    ckpt = _ckpt("openai/gpt-oss-20b")
    arch = _rearch(ckpt, model_type="gpt_oss_without_sinks")
    assert sliding_layers(arch) == 12
    cases, notes = _cases(ckpt, arch)
    assert notes == []
    by_source = {c.sources[0].rsplit("/", 1)[1]: c.args for c in cases}
    assert set(by_source) == {"self_attn", "self_attn:sliding"}
    assert by_source["self_attn"].window is None and by_source["self_attn:sliding"].window == 128
    full = by_source["self_attn"]
    assert (full.q_heads, full.kv_heads, full.head_dim, full.rope_theta) == (64, 8, 64, 150000.0)
    assert cases[0].metadata["rope_scaling_not_in_case"].startswith("yarn factor 32 (")
    # a serving step runs each module on its own layers
    sc = Scenario(isl=1024, osl=1024, conc=16, tp=1)
    steps = [c for c in scenario_cases(ckpt, next(iter(ckpt.schemes)), sc, [], arch)
             if c.type == "gqa" and c.step == "decode"]
    assert sorted((c.args.window or 0, c.count) for c in steps) == [(0, 12), (128, 12)]


def test_sliding_layers_without_a_window_size_are_not_derived():
    ckpt = _ckpt("openai/gpt-oss-20b")
    cases, notes = _cases(ckpt, _rearch(ckpt, model_type="gpt_oss_without_sinks", sliding_window=None))
    assert cases == [] and "sliding_window is None" in notes[0]


def test_a_sliding_window_without_layer_types_is_not_derived():
    ckpt = _ckpt("mistralai/Mixtral-8x7B-v0.1")
    cases, notes = _cases(ckpt, _rearch(ckpt, sliding_window=4096))
    assert cases == [] and "which layers slide is not stated" in notes[0]


def test_rotary_dim_sets_rope_dim():
    ckpt = _ckpt("meta-llama/Llama-3.1-8B-Instruct")
    cases, _ = _cases(ckpt, _rearch(ckpt, rotary_dim=64))
    assert (cases[0].args.head_dim, cases[0].args.rope_dim) == (128, 64)


def test_rope_facts_inside_rope_parameters_are_read_as_transformers_5_configs_keep_them():
    """Qwen3.5 keeps rope_theta and partial_rotary_factor in text_config.rope_parameters only: its
    gqa case gets theta 1e7 and rope_dim 256 x 0.25, and its gdn module comes with it."""
    cases, notes = _cases(_ckpt("Qwen/Qwen3.5-35B-A3B"))
    assert notes == [] and [c.type for c in cases] == ["gqa", "gdn"]
    gqa, gdn = (c.args for c in cases)
    assert (gqa.head_dim, gqa.rope_dim, gqa.rope_theta, gqa.gate, gqa.qk_norm) == (256, 64, 1e7, True, True)
    assert (gdn.qk_heads, gdn.v_heads, gdn.head_dim, gdn.conv_kernel) == (16, 32, 128, 4)


def test_a_rope_parameters_with_a_scaling_type_is_the_rope_scaling():
    ckpt = _ckpt("deepseek-ai/DeepSeek-V3")
    yarn = dict(ckpt.arch.config["rope_scaling"])
    theta = ckpt.arch.config["rope_theta"]
    moved = _rearch(ckpt, rope_scaling=None, rope_theta=None, rope_parameters={**yarn, "rope_theta": theta})
    (case,), notes = _cases(ckpt, moved)
    (same,), _ = _cases(ckpt)
    assert notes == [] and case.args == same.args
