"""Architecture facts read from a Hugging Face config.json, by structure rather than by name.

The same reader serves the shipped catalog (whose data files keep config.json keys verbatim)
and `from_config` on a user's file, so both paths agree on what each key means. A model is
recognised by the fields it has: `kv_lora_rank` means MLA, `o_lora_rank` DeepSeek-V4 attention,
an expert count means MoE, `linear_num_value_heads` gated-delta-net linear attention.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from typing import Any, Optional

from operatorx.catalog.errors import CatalogError, MissingField

__all__ = ["Arch", "read_arch"]

#: Keys that mean the same fact in different families' configs, first match wins.
_ALIASES: dict[str, tuple[str, ...]] = {
    "num_experts": ("n_routed_experts", "num_experts", "num_local_experts"),
    "top_k": ("num_experts_per_tok", "experts_per_token", "num_experts_per_token"),
    "n_shared_experts": ("n_shared_experts", "num_shared_experts"),
    "n_group": ("n_group", "num_expert_group"),
}

#: RoPE keys a config may state at top level or inside `rope_parameters`.
ROPE_PARAMETER_KEYS = ("rope_theta", "partial_rotary_factor")

#: Facts a model's reference implementation fixes when its config.json does not say them.
IMPLEMENTATION_KEYS = (
    "scoring_func", "e_score_correction_bias", "norm_topk_prob", "activation", "gate_dtype",
    "shared_expert_gate", "moe_intermediate_from", "qkv_bias", "gate_logits", "mxfp4_inter_align",
    "grouped_topk",
)


@dataclass(frozen=True)
class Arch:
    """One checkpoint's config (text part) plus implementation facts; `origin` names it in errors."""

    config: dict[str, Any]
    origin: str
    implementation: dict[str, Any] = field(default_factory=dict)

    # --- raw access ----------------------------------------------------------------------
    def _stated(self, key: str) -> Any:
        """The config's value of `key` or an alias; a RoPE key also inside `rope_parameters`, where
        transformers-5 configs (GLM-5, Qwen3.5) keep it; None when unstated."""
        for name in _ALIASES.get(key, (key,)):
            value = self.config.get(name)
            if value is not None:
                return value
        rope = self.config.get("rope_parameters")
        if key in ROPE_PARAMETER_KEYS and isinstance(rope, dict):
            return rope.get(key)
        return None

    def has(self, key: str) -> bool:
        return self._stated(key) is not None or self.implementation.get(key) is not None

    def get(self, key: str, needed_for: str) -> Any:
        """The value of `key` (or an alias); MissingField naming `key` when absent or null."""
        value = self._stated(key)
        if value is not None:
            return value
        if self.implementation.get(key) is not None:
            return self.implementation[key]
        raise MissingField(key, f"{needed_for} ({self.origin})")

    def opt(self, key: str, default: Any = None) -> Any:
        return self.get(key, "") if self.has(key) else default

    def int(self, key: str, needed_for: str) -> int:
        value = self.get(key, needed_for)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CatalogError(f"config field '{key}' must be a non-negative integer, got {value!r} ({self.origin})")
        return value

    # --- structure -----------------------------------------------------------------------
    @property
    def attention(self) -> str:
        """`mla`, `dsv4` (DeepSeek-V4 grouped low-rank output) or `gqa` (MHA is GQA with kv = heads)."""
        if self.config.get("o_lora_rank") is not None:
            return "dsv4"
        if self.config.get("kv_lora_rank") is not None:
            return "mla"
        return "gqa"

    @property
    def is_moe(self) -> bool:
        return self.has("num_experts")

    @property
    def has_linear_attention(self) -> bool:
        return self.config.get("linear_num_value_heads") is not None

    def head_dim(self, needed_for: str) -> builtins.int:
        """`head_dim` when given, else hidden / heads (what transformers derives)."""
        if self.config.get("head_dim") is not None:
            return self.int("head_dim", needed_for)
        hidden = self.int("hidden_size", needed_for)
        heads = self.int("num_attention_heads", needed_for)
        if hidden % heads:
            raise CatalogError(f"hidden_size={hidden} is not a multiple of num_attention_heads={heads} "
                               f"and config has no head_dim ({self.origin})")
        return hidden // heads

    def moe_inter(self, needed_for: str) -> builtins.int:
        """Per-expert intermediate size: `moe_intermediate_size`, or `intermediate_size` in
        families whose experts use it (Mixtral, gpt-oss: no separate moe key)."""
        if self.config.get("moe_intermediate_size") is not None:
            return self.int("moe_intermediate_size", needed_for)
        if self.implementation.get("moe_intermediate_from") == "intermediate_size":
            return self.int("intermediate_size", needed_for)
        if "num_local_experts" in self.config:  # Mixtral-style configs
            return self.int("intermediate_size", needed_for)
        raise MissingField("moe_intermediate_size", f"{needed_for} ({self.origin})")

    def dense_layers(self) -> builtins.int:
        """How many decoder layers run a dense MLP (0 when unknown for a MoE model)."""
        if not self.is_moe:
            return self.opt("num_hidden_layers", 1) or 1
        count = self.opt("first_k_dense_replace", 0) or 0
        count += len(self.opt("mlp_only_layers", []) or [])
        return count


def read_arch(config: dict[str, Any], origin: str, implementation: Optional[dict[str, Any]] = None) -> Arch:
    """Check the config is a decoder LM this package knows by structure; nested `text_config` is used.

    Unknown structure (no hidden size or heads, or neither a dense nor an expert MLP) is an
    error that names the missing fields; role-level gaps surface later as MissingField.
    """
    if not isinstance(config, dict):
        raise CatalogError(f"{origin}: config.json must hold a JSON object")
    text = config.get("text_config")
    flat = {**config, **text} if isinstance(text, dict) else dict(config)
    impl = dict(implementation or {})
    unknown = [k for k in impl if k not in IMPLEMENTATION_KEYS]
    if unknown:
        raise CatalogError(f"{origin}: unknown implementation keys {unknown}")
    arch = Arch(config=flat, origin=origin, implementation=impl)
    for key in ("hidden_size", "num_attention_heads"):
        if flat.get(key) is None:
            raise CatalogError(f"unknown architecture: config field '{key}' is missing ({origin})")
    if not arch.is_moe and flat.get("intermediate_size") is None:
        raise CatalogError("unknown architecture: config has neither 'intermediate_size' (dense MLP) nor an "
                           f"expert count ('n_routed_experts', 'num_experts' or 'num_local_experts') ({origin})")
    layer_types = set(flat.get("layer_types") or [])
    known_layers = {"full_attention", "sliding_attention", "linear_attention"}
    if layer_types - known_layers:
        raise CatalogError(f"unknown architecture: layer_types {sorted(layer_types - known_layers)} ({origin})")
    if "linear_attention" in layer_types and not arch.has_linear_attention:
        raise MissingField("linear_num_value_heads", f"linear_attention layers ({origin})")
    return arch
