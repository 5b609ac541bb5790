"""Generated GEMM shapes against hand-computed per-rank shapes (vLLM's TP sharding)."""

from __future__ import annotations

from operatorx.catalog import generate

from conftest import shapes_by_role


def test_deepseek_v3_mla_tp8():
    cases = generate(["deepseek-ai/DeepSeek-V3"], [8], [1])
    # heads/rank = 128/8 = 16; qk head = nope 128 + rope 64; v 128
    assert shapes_by_role(cases) == {
        "self_attn.fused_qkv_a_proj": (1536 + 512 + 64, 7168),  # replicated q_a + kv_a
        "self_attn.q_b_proj": (16 * 192, 1536),
        "self_attn.kv_b_proj": (16 * (128 + 128), 512),
        "self_attn.o_proj": (7168, 16 * 128),
        "mlp.gate_up_proj": (2 * 18432 // 8, 7168),  # 3 dense layers
        "mlp.down_proj": (7168, 18432 // 8),
        "mlp.gate": (256, 7168),
        "mlp.shared_experts.gate_up_proj": (2 * 2048 // 8, 7168),
        "mlp.shared_experts.down_proj": (7168, 2048 // 8),
        "lm_head": (129280 // 8, 7168),
    }
    qa = next(c for c in cases if c.sources[0].endswith("fused_qkv_a_proj"))
    assert qa.args.a.scale.group == [1, 128] and qa.args.b.scale.group == [128, 128]
    gate = next(c for c in cases if c.sources[0].endswith("mlp.gate"))
    assert gate.args.b.dtype == "bf16"


def test_gqa_tp4_llama_70b():
    cases = generate(["meta-llama/Llama-3.1-70B-Instruct"], [4], [1], schemes=["bf16"])
    # q heads/rank 64/4 = 16, kv heads/rank 8/4 = 2, head_dim 128
    assert shapes_by_role(cases) == {
        "self_attn.qkv_proj": ((16 + 2 * 2) * 128, 8192),
        "self_attn.o_proj": (8192, 16 * 128),
        "mlp.gate_up_proj": (2 * 28672 // 4, 8192),
        "mlp.down_proj": (8192, 28672 // 4),
        "lm_head": (128256 // 4, 8192),
    }


def test_gqa_kv_heads_replicated_when_tp_exceeds_them():
    cases = generate(["Qwen/Qwen3-235B-A22B-Thinking-2507"], [8], [1])
    # 64 q heads / 8 = 8 per rank; 4 kv heads < tp 8: one replica per rank
    assert shapes_by_role(cases)["self_attn.qkv_proj"] == ((8 + 2 * 1) * 128, 4096)


def test_dense_mlp_llama_8b_tp1():
    shapes = shapes_by_role(generate(["meta-llama/Llama-3.1-8B-Instruct"], [1], [1], schemes=["bf16"]))
    assert shapes["mlp.gate_up_proj"] == (2 * 14336, 4096)
    assert shapes["mlp.down_proj"] == (4096, 14336)


def test_sources_union_across_checkpoints():
    cases = generate(["meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Llama-3.3-70B-Instruct"], [4], [1],
                     schemes=["bf16"])
    qkv = next(c for c in cases if c.sources[0].endswith("qkv_proj"))
    assert qkv.sources == ["meta-llama/Llama-3.1-70B-Instruct/self_attn.qkv_proj",
                           "meta-llama/Llama-3.3-70B-Instruct/self_attn.qkv_proj"]


def test_quant_schemes_per_role():
    cases = generate(["nvidia/DeepSeek-R1-NVFP4"], [8], [16])
    by_role = {c.sources[0].rsplit("/", 1)[-1]: c for c in cases}
    assert by_role["self_attn.q_b_proj"].args.b.dtype == "bf16"  # self_attn* excluded
    assert by_role["mlp.down_proj"].args.b.dtype == "e2m1"
    assert by_role["mlp.down_proj"].args.a.scale.group == [1, 16]
