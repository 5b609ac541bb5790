"""The attention module of a checkpoint as the args of upstream's attention op types, for one batch.

Each case is the whole module (every head; `parallel` {tp, dp} says the split, and with dp the batch
is one dp group's), its fields read from the config: `gqa` for grouped-query attention, `mla` for
DeepSeek MLA, `mla_dsa` when the config has an indexer (`index_topk`), `gdn` for the linear-attention
layers of Qwen3.5/Qwen3-Next. The projections carry the checkpoint scheme's operands (attn_qkv for
the input projections, attn_out for the output one), so the case computes what the GEMM roles do;
mla_dsa's indexer wq_b and wk carry attn_qkv's too and its weights_proj stays bf16, as DeepSeek-V3.2's
FP8 checkpoint stores them.

DeepSeek-V4 (`o_lora_rank` in the config) is `dsv4_attn`, one module per layer kind: its layers differ
by `compress_ratios` (dsv4_modules says the kinds), each module carrying how many layers run it.

A fact the config does not state is a MissingField, never a guess: RoPE's `rope_theta` is one (a
checkpoint file without it gets no attention case). Attention types this module does not derive
(MLA without `q_lora_rank`; DeepSeek-V4 layers without `compress_ratios` or at a ratio whose cache and
indexer sharing the config does not state, as V4.1's 1 and 2) are a NotDerived naming them.

No config fact that changes the module is dropped in silence (attention_modules):
- a `rope_scaling` the gqa format cannot hold (Llama-3.1's llama3, gpt-oss's yarn) only changes RoPE's
  frequencies, not the work: the case is derived and its metadata says what was left out;
- sliding-window layers (`layer_types` naming `sliding_attention`) are their own module, a gqa with
  `window` = `sliding_window`, derived only when the config states both; a `sliding_window` without
  `layer_types` does not say which layers slide, so that is NotDerived;
- attention sinks (gpt-oss: vLLM's GptOssAttention adds a learned sink logit per head; config.json
  has no key for it) are not in the gqa format: NotDerived;
- DeepSeek-V4's window-only layers (ratio 0) run the yarn `rope_scaling` in vLLM too, but dsv4_attn
  holds it only with compress_ratio > 0: their metadata says so. `wo_a` is in `proj` with the checkpoint's
  attn_out operands (stored and run so; vLLM 0.26 has no bf16 wo_a), where upstream's dsv4_attn cases
  leave it out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from operatorx.catalog.arch import Arch
from operatorx.catalog.errors import CatalogError, MissingField, NotDerived
from operatorx.catalog.schemes import RoleSchemes, Scheme

__all__ = ["AttentionModule", "DSV4_INDEX_CACHES", "attention_args", "attention_modules", "dsv4_modules",
           "linear_attention_args", "attention_module", "sliding_layers"]

#: Model types whose vLLM attention runs RMS q/k norms (Qwen3Attention's q_norm/k_norm); config.json
#: has no key for it.
_QK_NORM_PREFIXES = ("qwen3",)
#: Model types whose attention adds a learned sink logit per head (vLLM GptOssAttention's `sinks`);
#: config.json has no key for it.
_SINK_MODEL_TYPES = ("gpt_oss",)


#: The cache `--kv-cache-dtype` DeepSeek-V4 runs on: vLLM 0.26's CUDA V4 attention keeps one layout,
#: fp8_ds_mla, and asserts an fp8 cache dtype for it (_resolve_dsv4_kv_cache_dtype).
_DSV4_KV_CACHE = "fp8"
#: The V4 indexer's key cache: fp8 (vLLM's default, first: what a deployment runs unless told) or mxfp4
#: (vLLM's attention_config.use_fp4_indexer_cache, sm_10x GPUs only).
DSV4_INDEX_CACHES = ("fp8", "mxfp4")
#: The compress ratios whose layer vLLM's DeepseekV4Attention fixes, with its indexer: 0 the window
#: alone, 4 a compressor and an own indexer (DeepseekV4Indexer), 128 a compressor and no indexer.
_DSV4_KINDS: dict[int, Optional[str]] = {0: None, 4: "own", 128: None}


@dataclass(frozen=True)
class AttentionModule:
    """One attention module of a checkpoint over one batch: the case type and args, the module it
    cites (`self_attn`, `self_attn:sliding`, `linear_attn`, DeepSeek-V4's `attn:c<ratio>`), and
    `metadata`: config facts the case format cannot hold, kept on the case so they are not lost.
    `layers`: the decoder layers that run it where the derivation counts them per kind (DeepSeek-V4);
    None leaves the count to the serving step's layer split."""

    kind: str
    args: dict[str, Any]
    role: str
    metadata: dict[str, str] = field(default_factory=dict)
    layers: Optional[int] = None


def attention_module(arch: Arch) -> str:
    """vLLM's module name of the full-attention block: `attn` in DeepSeek-V4, `self_attn` elsewhere."""
    return "attn" if arch.attention == "dsv4" else "self_attn"


def _pair(scheme: Scheme) -> dict[str, Any]:
    return {"a": scheme.a, "b": scheme.b}


def _split(tp: int, dp: int) -> dict[str, Any]:
    return {"parallel": {k: v for k, v in (("tp", tp), ("dp", dp)) if v > 1}} if tp * dp > 1 else {}


def _rope_theta(arch: Arch, what: str, key: str = "rope_theta") -> float:
    theta = arch.get(key, what)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise CatalogError(f"config field '{key}' must be a positive number, got {theta!r} ({arch.origin})")
    return float(theta)


def _yarn(arch: Arch) -> Optional[dict[str, Any]]:
    """`rope_scaling` of type yarn in the format's spelling; None without scaling; other types are
    NotDerived (the format's rope_scaling is yarn only)."""
    raw = rope_scaling(arch)
    if raw is None:
        return None
    kind = raw.get("type", raw.get("rope_type"))
    if kind != "yarn":
        raise NotDerived(f"rope_scaling of type {kind!r} (the attention types write yarn only)", arch.origin)
    out: dict[str, Any] = {"type": "yarn", "factor": float(raw["factor"]),
                           "original_max": int(raw["original_max_position_embeddings"])}
    for key in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        if raw.get(key) is not None and float(raw[key]) > 0:
            out[key] = float(raw[key])
    return out


def sliding_layers(arch: Arch) -> int:
    """How many decoder layers `layer_types` names `sliding_attention` (0 without layer_types)."""
    types = arch.config.get("layer_types") or []
    layers = arch.opt("num_hidden_layers", len(types)) or len(types)
    return sum(1 for t in types[:layers] if t == "sliding_attention")


def _window(arch: Arch) -> Optional[int]:
    """The sliding layers' window, None without sliding layers; NotDerived when the config does not
    say which layers slide or how far."""
    window = arch.config.get("sliding_window")
    if not sliding_layers(arch):
        if window is not None and not arch.config.get("layer_types") and arch.config.get("use_sliding_window", True):
            raise NotDerived("sliding-window attention layers", arch.origin,
                             f"sliding_window {window} without layer_types: which layers slide is not stated")
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise NotDerived("sliding-window attention layers", arch.origin,
                         f"layer_types names sliding_attention but sliding_window is {window!r}")
    return window


def _rope_dim(arch: Arch, head_dim: int) -> int:
    """`rotary_dim` where the config states it (MiniMax-M2), else head_dim x `partial_rotary_factor`."""
    from_factor = int(head_dim * float(arch.opt("partial_rotary_factor", 1.0)))
    if arch.opt("rotary_dim") is None:
        return from_factor
    rotary = arch.int("rotary_dim", "the gqa attention case")
    if arch.has("partial_rotary_factor") and rotary != from_factor:
        raise CatalogError(f"rotary_dim {rotary} and partial_rotary_factor give rope_dim {from_factor} ({arch.origin})")
    return rotary


def rope_scaling(arch: Arch) -> Optional[dict[str, Any]]:
    """The config's RoPE scaling: `rope_scaling`, else a `rope_parameters` whose rope_type is not
    "default" (transformers-5 configs); None without scaling."""
    raw = arch.config.get("rope_scaling")
    if isinstance(raw, dict):
        return raw
    params = arch.config.get("rope_parameters")
    if isinstance(params, dict) and params.get("rope_type", params.get("type", "default")) != "default":
        return params
    return None


def _scaling_left_out(arch: Arch, why: str = "the gqa case format has no rope_scaling") -> dict[str, str]:
    """The metadata line for a `rope_scaling` the case cannot hold (none without scaling)."""
    raw = rope_scaling(arch)
    if raw is None:
        return {}
    kind = raw.get("rope_type", raw.get("type"))
    factor = raw.get("factor")
    told = f"{kind} factor {float(factor):g}" if isinstance(factor, (int, float)) else f"{kind}"
    return {"rope_scaling_not_in_case": f"{told} ({why}; RoPE frequencies differ, the work does not)"}


def _gqa(arch: Arch, schemes: RoleSchemes) -> dict[str, Any]:
    what = "the gqa attention case"
    if arch.config.get("model_type") == "gpt_oss" and not arch.config.get("layer_types"):
        raise MissingField("layer_types", f"gpt-oss's sliding/full attention layers ({arch.origin})")
    if str(arch.config.get("model_type", "")) in _SINK_MODEL_TYPES:
        raise NotDerived("attention layers with sinks", arch.origin, "attention sinks are not in the gqa case format")
    head_dim = arch.head_dim(what)
    heads = arch.int("num_attention_heads", what)
    qkv, out = _pair(schemes["attn_qkv"]), _pair(schemes["attn_out"])
    return {
        "hidden": arch.int("hidden_size", what),
        "q_heads": heads,
        "kv_heads": arch.int("num_key_value_heads", what) if arch.has("num_key_value_heads") else heads,
        "head_dim": head_dim,
        "rope_dim": _rope_dim(arch, head_dim),
        "rope_theta": _rope_theta(arch, what),
        "qk_norm": str(arch.config.get("model_type", "")).startswith(_QK_NORM_PREFIXES),
        "gate": bool(arch.opt("attn_output_gate", False)),
        "proj": {"q_proj": qkv, "k_proj": qkv, "v_proj": qkv, "o_proj": out},
    }


def _mla(arch: Arch, schemes: RoleSchemes) -> tuple[str, dict[str, Any]]:
    what = "the mla attention case"
    if not arch.opt("q_lora_rank"):
        raise NotDerived("MLA without q_lora_rank (the mla types need a low-rank q)", arch.origin)
    qkv, out = _pair(schemes["attn_qkv"]), _pair(schemes["attn_out"])
    args: dict[str, Any] = {
        "hidden": arch.int("hidden_size", what),
        "heads": arch.int("num_attention_heads", what),
        "q_lora_rank": arch.int("q_lora_rank", what),
        "kv_lora_rank": arch.int("kv_lora_rank", what),
        "nope": arch.int("qk_nope_head_dim", what),
        "rope_dim": arch.int("qk_rope_head_dim", what),
        "v": arch.int("v_head_dim", what),
        "rope_theta": _rope_theta(arch, what),
        "proj": {"q_a_proj": qkv, "kv_a_proj_with_mqa": qkv, "q_b_proj": qkv, "kv_b_proj": qkv, "o_proj": out},
    }
    scaling = _yarn(arch)
    if scaling is not None:
        args["rope_scaling"] = scaling
    if arch.opt("index_topk") is None:
        return "mla", args
    args.update(topk=arch.int("index_topk", "the indexer (mla_dsa)"),
                index_heads=arch.int("index_n_heads", "the indexer (mla_dsa)"),
                index_dim=arch.int("index_head_dim", "the indexer (mla_dsa)"), indexer="own")
    args["proj"].update({"indexer.wq_b": qkv, "indexer.wk": qkv})
    return "mla_dsa", args


def _dsv4_layer_ratios(arch: Arch) -> list[int]:
    """The compress ratio of each decoder layer (`compress_ratios` up to num_hidden_layers; the entries
    after them are the MTP layers'); NotDerived without the list or at a ratio _DSV4_KINDS lacks."""
    what = "DeepSeek-V4 attention (dsv4_attn) layers"
    layers = arch.int("num_hidden_layers", what)
    ratios = arch.config.get("compress_ratios")
    if ratios is None:
        raise NotDerived(what, arch.origin, "config field 'compress_ratios' is missing: each layer's compress "
                                            "ratio, which makes it a window-only, compressed or indexed layer")
    if not isinstance(ratios, list) or len(ratios) < layers or not all(
            isinstance(r, int) and not isinstance(r, bool) for r in ratios[:layers]):
        raise CatalogError(f"config field 'compress_ratios' must list one integer ratio per decoder layer "
                           f"({arch.origin})")
    odd = sorted({r for r in ratios[:layers] if r not in _DSV4_KINDS})
    if odd:
        raise NotDerived(f"{what} at compress ratio {', '.join(map(str, odd))}", arch.origin,
                         "which layers compute, share or reuse the compressed cache and the indexer is not "
                         "stated by the config fields read here; vLLM 0.26's DeepSeek-V4 has ratios 0, 4 and 128")
    return list(ratios[:layers])


def _dsv4_args(arch: Arch, schemes: RoleSchemes, ratio: int, index_cache: Optional[str]) -> dict[str, Any]:
    """`dsv4_attn` args of the layers at `ratio` (batch and split aside). The input projections carry
    attn_qkv's operands, wo_a and wo_b attn_out's, the indexer's wq_b attn_qkv's; the compressors, the
    indexer's weights_proj and compressor stay bf16 (stored bf16, vLLM builds them unquantized)."""
    what = f"the dsv4_attn case (compress ratio {ratio})"
    qkv, out = _pair(schemes["attn_qkv"]), _pair(schemes["attn_out"])
    proj = {"wq_a": qkv, "wkv": qkv, "wq_b": qkv, "wo_a": out, "wo_b": out}
    args: dict[str, Any] = {
        "hidden": arch.int("hidden_size", what),
        "heads": arch.int("num_attention_heads", what),
        "head_dim": arch.int("head_dim", what),
        "rope_dim": arch.int("qk_rope_head_dim", what),
        "q_lora_rank": arch.int("q_lora_rank", what),
        "window": arch.int("sliding_window", what),
        "o_groups": arch.int("o_groups", what),
        "o_lora_rank": arch.int("o_lora_rank", what),
        "compress_ratio": ratio,
        "rope_theta": _rope_theta(arch, what),
        "kv_cache_dtype": _DSV4_KV_CACHE,
    }
    if ratio:                                 # vLLM: compress_rope_theta where compress_ratio > 1
        args["compress_rope_theta"] = _rope_theta(arch, what, "compress_rope_theta")
        scaling = _yarn(arch)
        if scaling is not None:
            args["rope_scaling"] = scaling
    if _DSV4_KINDS[ratio] == "own":
        index = "the DeepSeek-V4 indexer (dsv4_attn)"
        args.update(indexer="own", topk=arch.int("index_topk", index), index_heads=arch.int("index_n_heads", index),
                    index_dim=arch.int("index_head_dim", index), index_cache_dtype=index_cache)
        proj["indexer.wq_b"] = qkv
    return {**args, "proj": proj}


def _dsv4_metadata(arch: Arch, ratio: int, index_cache: Optional[str]) -> dict[str, str]:
    """What a `dsv4_attn` case cannot hold (module docstring): a window-only layer's rope_scaling and
    the engine setting behind an mxfp4 index-key cache."""
    meta: dict[str, str] = {}
    if not ratio:
        meta.update(_scaling_left_out(arch, "dsv4_attn holds rope_scaling only with compress_ratio > 0; vLLM's "
                                            "DeepSeek-V4 applies it to every layer"))
    if index_cache == "mxfp4":
        meta["index_cache"] = "mxfp4: vLLM's attention_config.use_fp4_indexer_cache (sm_10x GPUs only)"
    return meta


def dsv4_modules(arch: Arch, schemes: RoleSchemes, batch: dict[str, Any], tp: int, dp: int,
                 index_caches: Sequence[str] = DSV4_INDEX_CACHES[:1]) -> list[AttentionModule]:
    """DeepSeek-V4's attention as one `dsv4_attn` module per layer kind over `batch`, split over tp x dp,
    cited `attn:c<ratio>` and carrying its layer count (the counts add up to num_hidden_layers).

    A kind is a compress ratio (_DSV4_KINDS: 0 window only, 128 compressed, 4 compressed with its own
    indexer); a kind with an indexer is written once per index-key cache dtype in `index_caches`
    (default: vLLM's default alone, so a serving step counts each layer once)."""
    ratios = _dsv4_layer_ratios(arch)
    out: list[AttentionModule] = []
    for ratio in sorted(set(ratios)):
        caches: Sequence[Optional[str]] = index_caches if _DSV4_KINDS[ratio] else (None,)
        for cache in caches:
            args = {**_dsv4_args(arch, schemes, ratio, cache), "batch": batch, **_split(tp, dp)}
            out.append(AttentionModule("dsv4_attn", args, f"attn:c{ratio}", _dsv4_metadata(arch, ratio, cache),
                                       layers=ratios.count(ratio)))
    return out


def attention_args(arch: Arch, schemes: RoleSchemes, batch: dict[str, Any], tp: int,
                   dp: int) -> tuple[str, dict[str, Any]]:
    """(type, args) of the full-attention module over `batch`, split over tp x dp (gqa, mla, mla_dsa)."""
    if arch.attention == "dsv4":
        raise NotDerived("DeepSeek-V4 attention as one module", arch.origin,
                         "its layers are several dsv4_attn kinds: dsv4_modules derives them")
    kind, args = _mla(arch, schemes) if arch.attention == "mla" else ("gqa", _gqa(arch, schemes))
    return kind, {**args, "batch": batch, **_split(tp, dp)}


def attention_modules(arch: Arch, schemes: RoleSchemes, batch: dict[str, Any], tp: int, dp: int,
                      index_caches: Sequence[str] = DSV4_INDEX_CACHES[:1]) -> list[AttentionModule]:
    """Every attention module of the checkpoint over `batch`, split over tp x dp: the full-attention
    one (when some layer runs it), the sliding-window one (gqa with `window`) and the linear one;
    DeepSeek-V4's layer kinds (dsv4_modules, each own indexer once per `index_caches` dtype).

    All or nothing: a fact one module lacks (MissingField) or a type it cannot be (NotDerived) raises,
    so no model is shipped with part of its attention."""
    if arch.attention == "dsv4":
        return dsv4_modules(arch, schemes, batch, tp, dp, index_caches)
    kind, args = attention_args(arch, schemes, batch, tp, dp)
    role = attention_module(arch)
    if kind == "mla_dsa" and arch.opt("indexer_types") is not None:
        return index_share_modules(arch, args, role)
    meta = _scaling_left_out(arch) if kind == "gqa" else {}
    window = _window(arch) if kind == "gqa" else None
    types = arch.config.get("layer_types") or []
    full = not types or any(t == "full_attention" for t in types)
    out = [AttentionModule(kind, args, role, meta)] if full else []
    if window is not None:
        out.append(AttentionModule("gqa", {**args, "window": window}, f"{role}:sliding", meta))
    if arch.has_linear_attention:
        out.append(AttentionModule("gdn", linear_attention_args(arch, schemes, batch, tp, dp), "linear_attn"))
    return out


#: `indexer_types` entries (GLM-5.2's IndexShare): a layer with its own indexer, or one that reuses the top-k of
#: the last layer with one.
INDEXER_TYPES = {"full": "own", "shared": "reuse"}


def index_share_modules(arch: Arch, args: dict[str, Any], role: str) -> list[AttentionModule]:
    """An mla_dsa checkpoint whose `indexer_types` names each layer's indexer: one module per kind, cited
    `<role>` (own indexer) and `<role>:shared` (`indexer: reuse`, no indexer projections), each with its
    layer count, since a shared layer runs no indexer and only reads the top-k an earlier layer wrote."""
    layers = arch.int("num_hidden_layers", "the indexer_types layer split")
    types = arch.config["indexer_types"]
    if not isinstance(types, list) or len(types) != layers or any(t not in INDEXER_TYPES for t in types):
        raise CatalogError(f"config field 'indexer_types' must list one of {sorted(INDEXER_TYPES)} for each of the "
                           f"{layers} layers ({arch.origin})")
    if types[0] != "full":
        raise CatalogError(f"config field 'indexer_types': layer 0 is {types[0]!r}, but a shared layer reuses an "
                           f"earlier layer's top-k ({arch.origin})")
    own = sum(1 for t in types if t == "full")
    reuse_proj = {name: pair for name, pair in args["proj"].items() if not name.startswith("indexer.")}
    out = [AttentionModule("mla_dsa", args, role, layers=own)]
    if own < layers:
        out.append(AttentionModule("mla_dsa", {**args, "indexer": "reuse", "proj": reuse_proj}, f"{role}:shared",
                                   layers=layers - own))
    return out


def linear_attention_args(arch: Arch, schemes: RoleSchemes, batch: dict[str, Any], tp: int,
                          dp: int) -> dict[str, Any]:
    """`gdn` args of a gated-delta-net layer over `batch` (one head_dim: key and value dims agree)."""
    what = "the gdn attention case"
    key_dim, value_dim = arch.int("linear_key_head_dim", what), arch.int("linear_value_head_dim", what)
    if key_dim != value_dim:
        raise NotDerived(f"gated delta net with key head dim {key_dim} != value head dim {value_dim}", arch.origin)
    qkv, ba, out = _pair(schemes["attn_qkv"]), _pair(schemes["linear_attn_ba"]), _pair(schemes["attn_out"])
    return {
        "hidden": arch.int("hidden_size", what),
        "qk_heads": arch.int("linear_num_key_heads", what),
        "v_heads": arch.int("linear_num_value_heads", what),
        "head_dim": key_dim,
        "conv_kernel": arch.int("linear_conv_kernel_dim", what),
        "proj": {"in_proj_qkv": qkv, "in_proj_z": qkv, "in_proj_a": ba, "in_proj_b": ba, "out_proj": out},
        "batch": batch, **_split(tp, dp),
    }
