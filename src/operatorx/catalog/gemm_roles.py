"""Roles → per-rank GEMM shapes under tensor parallelism, the way vLLM builds the layers.

Column-parallel layers split N across ranks, row-parallel layers split K, replicated layers
split nothing. Each shape is `out[M, N] = a[M, K] @ w[N, K].T`; the role names are vLLM's
module names so a case's sources read like the model's `named_modules()`.

- GQA (`QKVParallelLinear`): Q heads split; KV heads split when TP divides them, else each
  rank holds one replica (TP must then be a multiple of the KV heads). `o_proj` is row-parallel.
- MLA (DeepSeek-V2/V3): `fused_qkv_a_proj` (q_a + kv_a, replicated), `q_b_proj` and
  `kv_b_proj` column-parallel, `o_proj` row-parallel; without q_lora_rank, `q_proj` is
  column-parallel and `kv_a_proj_with_mqa` replicated.
- Dense MLP and shared experts: `gate_up_proj` merged column-parallel, `down_proj` row-parallel.
- Router `gate` replicated; `lm_head` vocab-parallel over the vocab padded to 64.
- Gated-delta-net linear attention (Qwen3.5/Qwen3-Next): `in_proj_qkvz`, `in_proj_ba`
  column-parallel, `out_proj` row-parallel; `in_proj_ba` has its own scheme role
  (`linear_attn_ba`) because an FP8 release may keep it bf16 (Qwen3.5-397B-A17B-FP8 does).
- DeepSeek-V4 (vllm/models/deepseek_v4/attention.py, compressor.py, nvidia/model.py), modules
  named as vLLM names them (`attn.*`, `ffn.*`): `attn.fused_wqa_wkv` (wq_a + wkv, replicated),
  `attn.wq_b` column-parallel, `attn.wo_a` the grouped low-rank output (a bmm over
  o_groups/tp groups per rank: each case is ONE group's GEMM, N = o_lora_rank,
  K = heads*head_dim/o_groups), `attn.wo_b` row-parallel over o_groups*o_lora_rank.
  Layers with compress_ratio > 1 add `attn.compressor.fused_wkv_wgate` (replicated, unquantized,
  fp32 out; N = 2*coff*head_dim with coff 2 at ratio 4, else 1); ratio-4 layers add the
  indexer: `attn.indexer.wq_b` (replicated, quantized), `attn.indexer.weights_proj`
  (replicated, unquantized) and `attn.indexer.compressor.fused_wkv_wgate` (head index_head_dim).
  Hyper-connection mixing: `hc_attn_fn`/`hc_ffn_fn` (N = (2+hc_mult)*hc_mult) and `hc_head_fn`
  (N = hc_mult), K = hc_mult*hidden, fp32 weights, replicated; vLLM runs them inside fused
  tilelang kernels (mhc_pre / hc_head), so these cases time the GEMM part alone.
  The compressor roles carry the ratio as a suffix (`:c4`, `:c128`): the same module differs
  in shape by layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from operatorx.catalog.arch import Arch
from operatorx.catalog.errors import CatalogError, MissingField, NotDerived

__all__ = ["GemmShape", "gemm_shapes", "split", "mlp_prefix", "VOCAB_PADDING"]

#: vLLM's DEFAULT_VOCAB_PADDING_SIZE: lm_head rows are padded to a multiple of this before the split.
VOCAB_PADDING = 64


@dataclass(frozen=True)
class GemmShape:
    """A per-rank weight: `role` (vLLM module), `n` x `k`, the scheme role that quantizes it."""

    role: str
    n: int
    k: int
    scheme_role: str
    bias: bool = False
    #: A preset that overrides the checkpoint's scheme (layers vLLM builds with quant_config=None).
    preset: str | None = None
    out: str = "bf16"


def split(total: int, tp: int, field: str, origin: str) -> int:
    """`total / tp`, or an error naming the field TP does not divide."""
    if total % tp:
        raise CatalogError(f"tp={tp} does not divide {field}={total} ({origin})")
    return total // tp


def _kv_heads_per_rank(kv: int, tp: int, origin: str) -> int:
    if kv >= tp:
        return split(kv, tp, "num_key_value_heads", origin)
    if tp % kv:
        raise CatalogError(f"tp={tp} is neither a divisor nor a multiple of num_key_value_heads={kv} ({origin})")
    return 1  # replicated: each rank holds one KV head


def _gqa(arch: Arch, tp: int) -> list[GemmShape]:
    what = "attention (qkv_proj, o_proj)"
    hidden = arch.int("hidden_size", what)
    heads = split(arch.int("num_attention_heads", what), tp, "num_attention_heads", arch.origin)
    # Hugging Face's default when a config omits num_key_value_heads: plain MHA (kv = heads)
    kv_total = arch.int("num_key_value_heads" if arch.has("num_key_value_heads") else "num_attention_heads", what)
    kv = _kv_heads_per_rank(kv_total, tp, arch.origin)
    head_dim = arch.head_dim(what)
    q_heads = heads * 2 if arch.opt("attn_output_gate", False) else heads  # Qwen3.5 gate rides on q
    bias = bool(arch.opt("attention_bias", False) or arch.opt("qkv_bias", False))
    return [
        GemmShape("self_attn.qkv_proj", (q_heads + 2 * kv) * head_dim, hidden, "attn_qkv", bias),
        GemmShape("self_attn.o_proj", hidden, heads * head_dim, "attn_out",
                  bool(arch.opt("attention_bias", False)) and arch.config.get("model_type") == "gpt_oss"),
    ]


def _mla(arch: Arch, tp: int) -> list[GemmShape]:
    what = "MLA attention"
    hidden = arch.int("hidden_size", what)
    heads = split(arch.int("num_attention_heads", what), tp, "num_attention_heads", arch.origin)
    kv_lora = arch.int("kv_lora_rank", what)
    nope, rope = arch.int("qk_nope_head_dim", what), arch.int("qk_rope_head_dim", what)
    v_dim = arch.int("v_head_dim", what)
    shapes = []
    q_lora = arch.opt("q_lora_rank")
    if q_lora:
        shapes.append(GemmShape("self_attn.fused_qkv_a_proj", q_lora + kv_lora + rope, hidden, "attn_qkv"))
        shapes.append(GemmShape("self_attn.q_b_proj", heads * (nope + rope), q_lora, "attn_qkv"))
    else:
        shapes.append(GemmShape("self_attn.q_proj", heads * (nope + rope), hidden, "attn_qkv"))
        shapes.append(GemmShape("self_attn.kv_a_proj_with_mqa", kv_lora + rope, hidden, "attn_qkv"))
    shapes.append(GemmShape("self_attn.kv_b_proj", heads * (nope + v_dim), kv_lora, "attn_qkv"))
    shapes.append(GemmShape("self_attn.o_proj", hidden, heads * v_dim, "attn_out"))
    return shapes


def _dsv4_ratios(arch: Arch) -> set[int]:
    """The compress ratios of the decoder layers (vLLM: max(1, compress_ratios[layer]))."""
    what = "DeepSeek-V4 compressor/indexer (compress_ratios)"
    layers = arch.int("num_hidden_layers", what)
    ratios = arch.get("compress_ratios", what)
    if not isinstance(ratios, list) or len(ratios) < layers:
        raise CatalogError(f"config field 'compress_ratios' must list one ratio per decoder layer ({arch.origin})")
    return {max(1, int(r)) for r in ratios[:layers]}


def _dsv4(arch: Arch, tp: int) -> list[GemmShape]:
    what = "DeepSeek-V4 attention"
    hidden = arch.int("hidden_size", what)
    total_heads = arch.int("num_attention_heads", what)
    heads = split(total_heads, tp, "num_attention_heads", arch.origin)
    head_dim = arch.int("head_dim", what)
    q_lora = arch.int("q_lora_rank", what)
    o_lora = arch.int("o_lora_rank", what)
    o_groups = arch.int("o_groups", what)
    split(o_groups, tp, "o_groups", arch.origin)
    return [
        GemmShape("attn.fused_wqa_wkv", q_lora + head_dim, hidden, "attn_qkv"),
        GemmShape("attn.wq_b", heads * head_dim, q_lora, "attn_qkv"),
        GemmShape("attn.wo_a", o_lora, split(total_heads * head_dim, o_groups, "num_attention_heads*head_dim",
                                              arch.origin), "attn_out"),
        GemmShape("attn.wo_b", hidden, split(o_groups * o_lora, tp, "o_groups*o_lora_rank", arch.origin),
                  "attn_out"),
    ]


def _dsv4_compressed(arch: Arch, tp: int) -> list[GemmShape]:
    """Compressor and indexer GEMMs of the layers whose compress ratio is above 1."""
    if arch.attention != "dsv4":
        return []
    what = "DeepSeek-V4 compressor/indexer"
    hidden = arch.int("hidden_size", what)
    head_dim = arch.int("head_dim", what)
    shapes = []
    ratios = sorted(r for r in _dsv4_ratios(arch) if r > 1)
    for ratio in ratios:
        coff = 2 if ratio == 4 else 1
        shapes.append(GemmShape(f"attn.compressor.fused_wkv_wgate:c{ratio}", 2 * coff * head_dim, hidden,
                                "attn_qkv", preset="bf16", out="fp32"))
    if 4 in ratios:
        n_heads, i_dim = arch.int("index_n_heads", what), arch.int("index_head_dim", what)
        shapes += [
            GemmShape("attn.indexer.wq_b", n_heads * i_dim, arch.int("q_lora_rank", what), "attn_qkv"),
            GemmShape("attn.indexer.weights_proj", n_heads, hidden, "attn_qkv", preset="bf16"),
            GemmShape("attn.indexer.compressor.fused_wkv_wgate:c4", 2 * 2 * i_dim, hidden, "attn_qkv",
                      preset="bf16", out="fp32"),
        ]
    return shapes


def _hyper_connections(arch: Arch, tp: int) -> list[GemmShape]:
    """DeepSeek-V4 hyper-connection mixing weights (fp32, replicated)."""
    if arch.opt("hc_mult") is None:
        return []
    what = "hyper-connection mixing"
    mult = arch.int("hc_mult", what)
    k = mult * arch.int("hidden_size", what)
    mix = (2 + mult) * mult
    return [GemmShape("hc_attn_fn", mix, k, "router", preset="fp32", out="fp32"),
            GemmShape("hc_ffn_fn", mix, k, "router", preset="fp32", out="fp32"),
            GemmShape("hc_head_fn", mult, k, "router", preset="fp32", out="fp32")]


def _linear_attention(arch: Arch, tp: int) -> list[GemmShape]:
    what = "linear attention (in_proj_qkvz, in_proj_ba, out_proj)"
    hidden = arch.int("hidden_size", what)
    k_heads = split(arch.int("linear_num_key_heads", what), tp, "linear_num_key_heads", arch.origin)
    v_heads = split(arch.int("linear_num_value_heads", what), tp, "linear_num_value_heads", arch.origin)
    key_dim = k_heads * arch.int("linear_key_head_dim", what)
    value_dim = v_heads * arch.int("linear_value_head_dim", what)
    return [
        GemmShape("linear_attn.in_proj_qkvz", 2 * key_dim + 2 * value_dim, hidden, "attn_qkv"),
        GemmShape("linear_attn.in_proj_ba", 2 * v_heads, hidden, "linear_attn_ba"),
        GemmShape("linear_attn.out_proj", hidden, value_dim, "attn_out"),
    ]


def _mlp(prefix: str, hidden: int, inter: int, tp: int, field: str, scheme_role: str, origin: str) -> list[GemmShape]:
    per_rank = split(inter, tp, field, origin)
    return [GemmShape(f"{prefix}.gate_up_proj", 2 * per_rank, hidden, scheme_role),
            GemmShape(f"{prefix}.down_proj", hidden, per_rank, scheme_role)]


def _dense_mlp(arch: Arch, tp: int) -> list[GemmShape]:
    if arch.is_moe and arch.dense_layers() == 0:
        return []
    what = "dense MLP"
    return _mlp("mlp", arch.int("hidden_size", what), arch.int("intermediate_size", what), tp,
                "intermediate_size", "dense_mlp", arch.origin)


def mlp_prefix(arch: Arch) -> str:
    """vLLM's MLP module name: `ffn` in DeepSeek-V4, `mlp` elsewhere."""
    return "ffn" if arch.attention == "dsv4" else "mlp"


def _moe_side(arch: Arch, tp: int) -> list[GemmShape]:
    """Router gate and shared experts: the GEMMs of a MoE layer outside the fused experts."""
    if not arch.is_moe:
        return []
    hidden = arch.int("hidden_size", "router gate")
    prefix = mlp_prefix(arch)
    gate_out = "fp32" if arch.opt("gate_logits") == "fp32" else "bf16"
    shapes = [GemmShape(f"{prefix}.gate", arch.int("num_experts", "router gate"), hidden, "router",
                        arch.config.get("model_type") == "gpt_oss", out=gate_out)]
    if arch.opt("shared_expert_intermediate_size"):
        inter = arch.int("shared_expert_intermediate_size", "shared expert")
        shapes += _mlp("mlp.shared_expert", hidden, inter, tp, "shared_expert_intermediate_size",
                       "shared_experts", arch.origin)
        shapes.append(GemmShape("mlp.shared_expert_gate", 1, hidden, "router"))
    elif arch.opt("n_shared_experts"):
        inter = arch.moe_inter("shared experts") * arch.int("n_shared_experts", "shared experts")
        shapes += _mlp(f"{prefix}.shared_experts", hidden, inter, tp, "moe_intermediate_size*n_shared_experts",
                       "shared_experts", arch.origin)
    return shapes


def _lm_head(arch: Arch, tp: int) -> list[GemmShape]:
    vocab = arch.int("vocab_size", "lm_head")
    padded = -(-vocab // VOCAB_PADDING) * VOCAB_PADDING
    return [GemmShape("lm_head", split(padded, tp, "vocab_size (padded to 64)", arch.origin),
                      arch.int("hidden_size", "lm_head"), "lm_head")]


def _attention(arch: Arch, tp: int) -> list[GemmShape]:
    if arch.attention == "dsv4":
        return _dsv4(arch, tp)
    shapes = _mla(arch, tp) if arch.attention == "mla" else _gqa(arch, tp)
    if arch.has_linear_attention:
        shapes += _linear_attention(arch, tp)
    return shapes


#: Role groups in the order they are emitted; each fails alone when its facts are missing.
ROLE_GROUPS: dict[str, Callable[[Arch, int], list[GemmShape]]] = {
    "attention": _attention,
    "compressor_indexer": _dsv4_compressed,
    "hyper_connections": _hyper_connections,
    "dense_mlp": _dense_mlp,
    "moe_side": _moe_side,
    "lm_head": _lm_head,
}


def gemm_shapes(arch: Arch, tp: int, strict: bool, skipped: list[str],
                 leave_out: tuple[str, ...] = ()) -> list[GemmShape]:
    """All per-rank GEMM weights of one decoder at `tp`.

    strict: a missing field raises (from_config). Otherwise the role group is skipped and one
    line naming the field goes to `skipped` (the catalog leaves unconfirmed facts out).
    leave_out: role groups a checkpoint data file declares not produced (with its reason there).
    A TP that does not divide a split dimension always raises.
    """
    shapes: list[GemmShape] = []
    for name, build in ROLE_GROUPS.items():
        if name in leave_out:
            continue
        try:
            shapes += build(arch, tp)
        except (MissingField, NotDerived) as err:
            if strict:
                raise
            skipped.append(f"{arch.origin}: {name} not produced: {err}")
    return shapes
