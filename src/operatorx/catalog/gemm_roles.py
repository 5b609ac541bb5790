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
  column-parallel, `out_proj` row-parallel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from operatorx.catalog.arch import Arch
from operatorx.catalog.errors import CatalogError, MissingField, NotDerived

__all__ = ["GemmShape", "gemm_shapes", "split", "VOCAB_PADDING"]

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
    kv = _kv_heads_per_rank(arch.int("num_key_value_heads", what), tp, arch.origin)
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


def _linear_attention(arch: Arch, tp: int) -> list[GemmShape]:
    what = "linear attention (in_proj_qkvz, in_proj_ba, out_proj)"
    hidden = arch.int("hidden_size", what)
    k_heads = split(arch.int("linear_num_key_heads", what), tp, "linear_num_key_heads", arch.origin)
    v_heads = split(arch.int("linear_num_value_heads", what), tp, "linear_num_value_heads", arch.origin)
    key_dim = k_heads * arch.int("linear_key_head_dim", what)
    value_dim = v_heads * arch.int("linear_value_head_dim", what)
    return [
        GemmShape("linear_attn.in_proj_qkvz", 2 * key_dim + 2 * value_dim, hidden, "attn_qkv"),
        GemmShape("linear_attn.in_proj_ba", 2 * v_heads, hidden, "attn_qkv"),
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


def _moe_side(arch: Arch, tp: int) -> list[GemmShape]:
    """Router gate and shared experts: the GEMMs of a MoE layer outside the fused experts."""
    if not arch.is_moe:
        return []
    hidden = arch.int("hidden_size", "router gate")
    shapes = [GemmShape("mlp.gate", arch.int("num_experts", "router gate"), hidden, "router",
                        arch.config.get("model_type") == "gpt_oss")]
    if arch.opt("shared_expert_intermediate_size"):
        inter = arch.int("shared_expert_intermediate_size", "shared expert")
        shapes += _mlp("mlp.shared_expert", hidden, inter, tp, "shared_expert_intermediate_size",
                       "shared_experts", arch.origin)
        shapes.append(GemmShape("mlp.shared_expert_gate", 1, hidden, "router"))
    elif arch.opt("n_shared_experts"):
        inter = arch.moe_inter("shared experts") * arch.int("n_shared_experts", "shared experts")
        shapes += _mlp("mlp.shared_experts", hidden, inter, tp, "moe_intermediate_size*n_shared_experts",
                       "shared_experts", arch.origin)
    return shapes


def _lm_head(arch: Arch, tp: int) -> list[GemmShape]:
    vocab = arch.int("vocab_size", "lm_head")
    padded = -(-vocab // VOCAB_PADDING) * VOCAB_PADDING
    return [GemmShape("lm_head", split(padded, tp, "vocab_size (padded to 64)", arch.origin),
                      arch.int("hidden_size", "lm_head"), "lm_head")]


def _attention(arch: Arch, tp: int) -> list[GemmShape]:
    if arch.attention == "dsv4":
        raise NotDerived("DeepSeek-V4 attention roles (wq_a, wq_b, wkv, wo_a, wo_b, compressor, indexer, "
                         "hyper-connection mixing)", arch.origin)
    shapes = _mla(arch, tp) if arch.attention == "mla" else _gqa(arch, tp)
    if arch.has_linear_attention:
        shapes += _linear_attention(arch, tp)
    return shapes


#: Role groups in the order they are emitted; each fails alone when its facts are missing.
ROLE_GROUPS: dict[str, Callable[[Arch, int], list[GemmShape]]] = {
    "attention": _attention,
    "dense_mlp": _dense_mlp,
    "moe_side": _moe_side,
    "lm_head": _lm_head,
}


def gemm_shapes(arch: Arch, tp: int, strict: bool, skipped: list[str]) -> list[GemmShape]:
    """All per-rank GEMM weights of one decoder at `tp`.

    strict: a missing field raises (from_config). Otherwise the role group is skipped and one
    line naming the field goes to `skipped` (the catalog leaves unconfirmed facts out).
    A TP that does not divide a split dimension always raises.
    """
    shapes: list[GemmShape] = []
    for name, build in ROLE_GROUPS.items():
        try:
            shapes += build(arch, tp)
        except (MissingField, NotDerived) as err:
            if strict:
                raise
            skipped.append(f"{arch.origin}: {name} not produced: {err}")
    return shapes
