"""One DeepSeek-V3.2 (mla_dsa) module's weights: the MLA ones plus its lightning indexer's.

The indexer (vLLM 0.26's deepseek_v2.Indexer) owns `wq_b` (q latent -> index_heads·index_dim), `wk`
(hidden -> index_dim), a LayerNorm with weight and bias on the key (`k_norm`, eps 1e-6) and
`weights_proj` (hidden -> index_heads, one weight per index head and token). The MLA part is
mla_weights' over the same sizes (`mla_args`), so the dense MLA reference runs on the very same
tensors. Why one dataclass: the reference and the vLLM build load and read one set.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from operatorx.backends.torch.attention.gqa import _linear
from operatorx.backends.torch.attention.mla import MlaWeights, mla_weights
from operatorx.spec.attention import MlaArgs, MlaDsaArgs

__all__ = ["DsaWeights", "INDEX_NORM_EPS", "MLA_PROJECTIONS", "dsa_weights", "mla_args"]

#: The indexer key LayerNorm's eps (vLLM's Indexer: LayerNorm(head_dim, eps=1e-6)).
INDEX_NORM_EPS = 1e-6
#: The projections mla_dsa shares with mla (the rest are the indexer's).
MLA_PROJECTIONS = ("q_a_proj", "kv_a_proj_with_mqa", "q_b_proj", "kv_b_proj", "o_proj")


@dataclass
class DsaWeights:
    mla: MlaWeights
    wq_b: torch.Tensor            # [index_heads·index_dim, q_lora_rank]
    wk: torch.Tensor              # [index_dim, hidden]
    k_norm: torch.Tensor          # [index_dim] LayerNorm weight
    k_norm_bias: torch.Tensor     # [index_dim] LayerNorm bias
    weights_proj: torch.Tensor    # [index_heads, hidden]

    def nbytes(self) -> int:
        own = sum(getattr(self, f.name).numel() * getattr(self, f.name).element_size()
                  for f in fields(self) if f.name != "mla")
        return self.mla.nbytes() + own


def mla_args(args: MlaDsaArgs) -> MlaArgs:
    """The dense MLA case of the same module: its sizes, rope, batch and MLA projections; the latent cache
    dtype carried where mla has it (fp8_ds_mla, a sparse-only layout, maps to fp8)."""
    proj = {k: v for k, v in (args.proj or {}).items() if k in MLA_PROJECTIONS} or None
    cache = "fp8" if args.kv_cache_dtype == "fp8_ds_mla" else args.kv_cache_dtype
    return MlaArgs(hidden=args.hidden, batch=args.batch, proj=proj, parallel=args.parallel, heads=args.heads,
                   q_lora_rank=args.q_lora_rank, kv_lora_rank=args.kv_lora_rank, nope=args.nope,
                   rope_dim=args.rope_dim, v=args.v, rope=True, rope_theta=args.rope_theta,
                   rope_scaling=args.rope_scaling, kv_cache_dtype=cache)


def dsa_weights(args: MlaDsaArgs, gen: torch.Generator, device: str) -> DsaWeights:
    """Random bf16 weights as mla_weights draws them (N(0, 1/in)), then the indexer's: its LayerNorm weight
    near 1 and bias near 0 (random, so a dropped one shows)."""
    ih, idim, h = args.index_heads, args.index_dim, args.hidden
    mla = mla_weights(mla_args(args), gen, device)
    wq_b = _linear(ih * idim, args.q_lora_rank, gen, device)
    wk = _linear(idim, h, gen, device)
    k_norm = 1 + 0.1 * torch.randn(idim, generator=gen, device=device, dtype=torch.bfloat16)
    k_norm_bias = 0.1 * torch.randn(idim, generator=gen, device=device, dtype=torch.bfloat16)
    weights_proj = _linear(ih, h, gen, device)
    return DsaWeights(mla, wq_b, wk, k_norm, k_norm_bias, weights_proj)
