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


def test_deepseek_v4_pro_roles_tp8():
    """vLLM DeepseekV4Attention/Compressor/Indexer/MoE at TP 8, checked against the published
    tensor shapes (wq_a [1536,7168] + wkv [512,7168], wq_b [65536,1536], wo_a [16384,4096],
    wo_b [7168,16384], compressor wkv/wgate [1024|512,7168], indexer wq_b [8192,1536],
    weights_proj [64,7168], indexer compressor [256,7168], hc_*_fn [24|4, 28672])."""
    shapes = shapes_by_role(generate(["deepseek-ai/DeepSeek-V4-Pro"], [8], [1]))
    assert shapes == {
        "attn.fused_wqa_wkv": (1536 + 512, 7168),  # replicated
        "attn.wq_b": (65536 // 8, 1536),
        "attn.wo_a": (1024, 4096),  # one group of 16/8 = 2 per rank
        "attn.wo_b": (7168, 16384 // 8),
        "attn.compressor.fused_wkv_wgate:c4": (2 * 1024, 7168),
        "attn.compressor.fused_wkv_wgate:c128": (2 * 512, 7168),
        "attn.indexer.wq_b": (8192, 1536),
        "attn.indexer.weights_proj": (64, 7168),
        "attn.indexer.compressor.fused_wkv_wgate:c4": (2 * 256, 7168),
        "hc_attn_fn": (24, 4 * 7168),
        "hc_ffn_fn": (24, 4 * 7168),
        "hc_head_fn": (4, 4 * 7168),
        "ffn.gate": (384, 7168),
        "ffn.shared_experts.gate_up_proj": (2 * 3072 // 8, 7168),
        "ffn.shared_experts.down_proj": (7168, 3072 // 8),
        "lm_head": (129280 // 8, 7168),
    }


def test_deepseek_v4_operand_types_and_hash_layers():
    cases = generate(["deepseek-ai/DeepSeek-V4-Flash"], [8], [1], moe_tokens=[1])
    by_role = {c.sources[0].rsplit("/", 1)[-1]: c for c in cases}
    assert by_role["attn.wq_b"].args.b.scale.dtype == "ue8m0"
    comp = by_role["attn.compressor.fused_wkv_wgate:c4"].args
    assert (comp.a.dtype, comp.b.dtype, comp.out) == ("bf16", "bf16", "fp32")
    hc = by_role["hc_attn_fn"].args
    assert (hc.a.dtype, hc.b.dtype, hc.out) == ("fp32", "fp32", "fp32")
    hashed = by_role["ffn.experts:hash"].args.router
    assert hashed.select.kind == "hash" and hashed.select.vocab == 129280 and hashed.bias is False
    assert by_role["ffn.experts"].args.router.bias is True


def test_minimax_m2_tp4():
    cases = generate(["MiniMaxAI/MiniMax-M2"], [4], [1], moe_tokens=[1])
    # 48 q heads / 4 = 12, 8 kv heads / 4 = 2, head_dim 128; every layer MoE, no shared expert
    assert shapes_by_role(cases) == {
        "self_attn.qkv_proj": ((12 + 2 * 2) * 128, 3072),
        "self_attn.o_proj": (3072, 12 * 128),
        "mlp.gate": (256, 3072),
        "lm_head": (200064 // 4, 3072),
    }
    moe = next(c for c in cases if c.type == "moe").args
    assert moe.experts.inter == 1536 // 4 and moe.shared is None
    assert moe.router.gate.dtype == "fp32" and moe.router.renormalize is True and moe.router.bias is True
