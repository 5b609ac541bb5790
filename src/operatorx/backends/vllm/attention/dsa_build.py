"""Build an mla_dsa case through vLLM: DeepseekV2MLAAttention with its Indexer, both caches as the runner
allocates them, both metadata builders under one forward context, the timed call (imports vLLM; called
from attention/dsa.py).

- backends: the sparse MLA backend vLLM picked for the module's MLAAttention (use_sparse: on sm90
  FLASH_ATTN_MLA_SPARSE for a bf16 cache, then FLASHMLA_SPARSE) and the indexer cache layer's own
  (DeepseekV32IndexerCache.get_attn_backend: DEEPSEEK_V32_INDEXER); the block size is the MLA backend's
  preferred one (64), which the indexer's spec shares (both read cache_config.block_size);
- caches: the latent cache [blocks, block_size, kv_lora_rank + rope_dim] bf16 (build.allocate_cache:
  normals), and the indexer's get_kv_cache_shape(blocks, block_size, 1, index_dim + index_dim/128·4)
  uint8, filled with normal keys in its fp8 layout (dsa_layout.pack_index_block); both bound with
  bind_kv_cache under their layer names (`<prefix>.attn`, `<prefix>.indexer.k_cache`);
- metadata: each builder over one CommonAttentionMetadata of batch.py's index, ordered by the MLA
  builder's reorder_batch_threshold (the indexer's opts out of the vote and splits at its own);
- the timed call: module.forward inside set_forward_context with both layers' metadata and slot mappings; a
  CUDA graph where build.graph_rule says vLLM runs a FULL decode graph, else eager;
- the check reads vLLM's selection back from topk_indices_buffer (request-relative positions, -1 none) in
  batch order, so the reference attends the same keys, and reports how much its own top-k overlaps.
- `indexer: reuse` (vLLM's skip layer): no indexer layer, cache or builder; topk_indices_buffer is filled once
  with dsa_reuse.reused_topk's picks, as an earlier layer's indexer leaves them, and the timed call (MLA
  projections, latent cache write, sparse attention, o_proj) reads it; the reference attends those picks.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Optional

import torch

from operatorx.backends.base import Unsupported
from operatorx.backends.torch.attention.dsa import DsaWeights, dsa_weights, mla_args
from operatorx.backends.torch.attention.layout import Layout, Request, plan_layout
from operatorx.backends.torch.memory import require_memory
from operatorx.backends.vllm.attention.batch import batch_index, cached_latents
from operatorx.backends.vllm.attention.build import (
    FILL_CHUNK_BYTES,
    allocate_cache,
    cache_dtype_str,
    capture_or_error,
    common_metadata,
    graph_rule,
)
from operatorx.backends.vllm.attention.built import BuiltPaged
from operatorx.backends.vllm.attention.dsa_layout import index_cache_width, pack_index_block, read_index_keys
from operatorx.backends.vllm.attention.dsa_meta import dsa_metadata
from operatorx.backends.vllm.attention.dsa_module import dsa_case_config, load_dsa_weights, make_dsa_module
from operatorx.backends.vllm.attention.dsa_reuse import DRAW_PEAK_BYTES, reused_topk
from operatorx.backends.vllm.attention.dsa_support import dsa_projection_plan
from operatorx.backends.vllm.attention.mla_build import device_bytes as mla_device_bytes
from operatorx.backends.vllm.attention.mla_module import set_block_size
from operatorx.backends.vllm.attention.module import max_position
from operatorx.backends.vllm.attention.proj import projection_kernels, quant_config_of
from operatorx.backends.vllm.attention.support import DEEPSEEK_MLA
from operatorx.backends.vllm.common import vllm_refusals
from operatorx.backends.vllm.env import VllmEnv
from operatorx.spec import Case
from operatorx.spec.attention import MlaDsaArgs

__all__ = ["BuiltDsa", "IndexPart", "build_dsa", "dsa_device_bytes"]

DSA_LAYERS = ("fused_qkv_a_proj", "q_b_proj", "kv_b_proj", "o_proj")


@dataclass(kw_only=True)
class BuiltDsa(BuiltPaged):
    index_name: Optional[str]
    """The Indexer's key-cache layer; None for a reuse layer (no indexer)."""
    weights: DsaWeights
    index_cache: Optional[torch.Tensor]
    topk_indices: torch.Tensor
    """The model's int32 [max_num_batched_tokens, topk] buffer the Indexer writes (a reuse layer: filled
    once), in batch order."""
    index_metadata: Any
    index_dim: int

    def layer_metadata(self) -> dict[str, Any]:
        own = {} if self.index_name is None else {self.index_name: self.index_metadata}
        return {self.layer_name: self.attn_metadata, **own}

    def slot_mappings(self) -> dict[str, torch.Tensor]:
        own = {} if self.index_name is None else {self.index_name: self.slot_mapping}
        return {self.layer_name: self.slot_mapping, **own}

    def forward(self) -> torch.Tensor:
        out: torch.Tensor = self.module(self.positions, self.x_batch, None)
        return out

    def cached(self, r: Request) -> torch.Tensor:
        return cached_latents(self.kv_cache, r)

    def latent_quantized(self, r: Request) -> bool:
        """Whether vLLM runs kv_b_proj as a layer over the request's latents: a request after the builder's
        decodes when MLAAttention takes its dense prefill (forward_mha: a prefill backend, the prefills'
        longest sequence within topk, sparse_mla_force_mqa off); else every token runs the absorbed sparse
        forward_mqa."""
        md = self.attn_metadata
        decodes = getattr(md, "num_decodes", None)
        if decodes is None:
            raise RuntimeError(f"{type(md).__name__}: no num_decodes; which requests ran forward_mha is unknown")
        force = bool(getattr(self.config.attention_config, "sparse_mla_force_mqa", False))
        longest = getattr(md, "prefill_max_seq_len", None)
        use_mha = (getattr(self.attn, "prefill_backend", None) is not None and longest is not None
                   and longest <= getattr(md, "topk_tokens", -1) and not force)
        position = self.index.order.index(self.layout.requests.index(r))
        return use_mha and position >= int(decodes)

    def cached_keys(self, r: Request) -> torch.Tensor:
        if self.index_cache is None:
            raise RuntimeError("a reuse layer has no indexer cache")
        return read_index_keys(self.index_cache, r, self.index_dim)

    def selection(self, r: Request, pick: torch.Tensor) -> torch.Tensor:
        """vLLM's selected positions of the request's new tokens `pick` (offsets), from the buffer's rows in
        batch order."""
        batch_row = torch.argsort(self.index.rows)                     # layout row -> batch row
        rows = batch_row[pick.cpu() + r.row0].to(self.topk_indices.device)
        return self.topk_indices[rows].long()


def dsa_device_bytes(args: MlaDsaArgs, layout: Layout, positions: int, buffer_rows: int) -> int:
    """The MLA module's (mla_build.device_bytes) plus the topk buffer (`buffer_rows`: the scheduler's
    max_num_batched_tokens) and an own indexer: its weights, fp8 key cache, its prefill gather workspace
    (get_max_prefill_buffer_size: 40 · max_model_len keys) and one fp32 logits row per new token over the
    longest sequence; a reuse layer's picks are drawn in chunks instead (dsa_reuse.DRAW_PEAK_BYTES)."""
    ih, idim, t = args.index_heads, args.index_dim, layout.tokens
    base = mla_device_bytes(mla_args(args), layout) + buffer_rows * args.topk * 4
    if args.indexer == "reuse":
        return base + DRAW_PEAK_BYTES
    weights = (ih * idim * args.q_lora_rank + (idim + ih) * args.hidden) * 2
    cache = (layout.pool_pages + 1) * layout.page_tokens * index_cache_width(idim)
    longest = max(r.ctx + r.q for r in layout.requests)
    return base + weights + cache + 40 * positions * index_cache_width(idim) + t * longest * 4


def _index_cache(backend: Any, spec: Any, num_blocks: int, index_dim: int, gen: torch.Generator) -> torch.Tensor:
    shape = tuple(backend.get_kv_cache_shape(num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size))
    want = (num_blocks, spec.block_size, index_cache_width(index_dim))
    if shape != want or spec.dtype != torch.uint8:
        raise Unsupported(f"{backend.get_name()}: indexer cache {shape} {spec.dtype} is not the {want} uint8 layout "
                          "this backend fills and reads back")
    cache = torch.empty(shape, dtype=torch.uint8, device="cuda")
    step = max(1, FILL_CHUNK_BYTES // (spec.block_size * index_dim * 4))
    for b0 in range(0, num_blocks, step):
        b1 = min(num_blocks, b0 + step)
        keys = torch.randn((b1 - b0, spec.block_size, index_dim), generator=gen, device="cuda")
        cache[b0:b1].copy_(pack_index_block(keys))
    return cache


@dataclass(frozen=True)
class IndexPart:
    """An own indexer's key-cache layer as built: its name, backend, spec, metadata builder and filled cache."""

    name: str
    backend: Any
    spec: Any
    builder: Any
    cache: torch.Tensor


def _index_part(layer: Any, name: str, config: Any, layout: Layout, index: Any, args: MlaDsaArgs,
                gen: torch.Generator) -> IndexPart:
    """The indexer cache layer's backend, builder and filled fp8 key cache (module docstring)."""
    backend, spec = layer.get_attn_backend(), layer.get_kv_cache_spec(config)
    if spec.block_size != layout.page_tokens:
        raise Unsupported(f"block size: indexer {spec.block_size}; the layout pages by {layout.page_tokens}")
    with vllm_refusals(f"the {backend.get_name()} metadata builder", construction=True):
        builder = backend.get_builder_cls()(spec, [name], config, torch.device("cuda"))
    return IndexPart(name, backend, spec, builder, _index_cache(backend, spec, index.num_blocks, args.index_dim, gen))


def build_dsa(case: Case, args: MlaDsaArgs, stack: ExitStack) -> BuiltDsa:
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context
    from vllm.utils.deep_gemm import has_deep_gemm
    from vllm.v1.worker.utils import bind_kv_cache

    if args.indexer == "own" and not has_deep_gemm():
        raise Unsupported("DeepGEMM is not installed: vLLM's indexer scores keys with its fp8_mqa_logits kernels")
    default_layout = plan_layout(args.batch)
    positions_max = max_position(default_layout)
    longest = max(r.ctx + r.q for r in default_layout.requests)
    env = VllmEnv.get()
    stack.enter_context(env.case_scope())
    config, cache_config, model_config = dsa_case_config(env.config, args, positions_max,
                                                          default_layout.tokens)
    max_tokens = int(config.scheduler_config.max_num_batched_tokens)
    require_memory(dsa_device_bytes(args, default_layout, positions_max, max_tokens), "cuda")
    stack.enter_context(set_current_vllm_config(config))
    prefix = env.unique_prefix("self_attn")
    reuse = args.indexer == "reuse"
    layer_name, index_name = f"{prefix}.attn", None if reuse else f"{prefix}.indexer.k_cache"
    stack.callback(env.forget_layer, layer_name)
    if index_name is not None:
        stack.callback(env.forget_layer, index_name)
    plan = dsa_projection_plan(args)
    assert not isinstance(plan, str), plan                   # refused in supports()
    if default_layout.tokens > max_tokens:
        raise Unsupported(f"batch: {default_layout.tokens} new tokens exceed max_num_batched_tokens {max_tokens}, "
                          "the rows of vLLM's topk_indices_buffer")
    topk_indices = torch.full((max_tokens, args.topk), -1, dtype=torch.int32, device="cuda")
    with vllm_refusals(f"the quant config {plan.quant.cls if plan.quant else None}", construction=True):
        quant_config = quant_config_of(plan)
    with vllm_refusals(f"to build {DEEPSEEK_MLA.cls} (DeepSeek-V3.2)", construction=True), torch.device("cuda"):
        module = make_dsa_module(config, args, cache_config, prefix, positions_max, longest, topk_indices,
                                 quant_config)
    attn = module.mla_attn.mla_attn
    index_layer = None if reuse else module.indexer.k_cache
    if attn.layer_name != layer_name or (index_layer is not None and index_layer.prefix != index_name):
        raise RuntimeError(f"{DEEPSEEK_MLA.cls}: its layers are {attn.layer_name!r} and "
                           f"{getattr(index_layer, 'prefix', None)!r}, expected {layer_name!r} and {index_name!r}")
    backend = attn.attn_backend
    if not backend.is_sparse():
        raise Unsupported(f"{backend.get_name()}: vLLM selected a dense MLA backend for a sparse module")
    block_size = set_block_size(config, backend)
    layout = plan_layout(args.batch, None, block_size)
    gen = torch.Generator(device="cuda").manual_seed(case.seed())
    with vllm_refusals("to load the projections", construction=True):
        weights = load_dsa_weights(module, dsa_weights(args, gen, "cuda"), model_config, plan)
    layers = projection_kernels(module, DSA_LAYERS, plan)
    if not reuse:
        layers["layers"]["indexer.wq_b"] = projection_kernels(module.indexer, ("wq_b",), plan)["layers"]["wq_b"]

    spec = attn.get_kv_cache_spec(config)
    if spec.block_size != layout.page_tokens:
        raise Unsupported(f"block size: MLA {spec.block_size}; the layout pages by {layout.page_tokens}")
    names = backend.get_name()
    with vllm_refusals(f"the {names} metadata builder", construction=True):
        builder = backend.get_builder_cls()(spec, [layer_name], config, torch.device("cuda"))
    index = batch_index(layout, getattr(builder, "reorder_batch_threshold", None))
    shape = tuple(backend.get_kv_cache_shape(index.num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size,
                                             cache_dtype_str=cache_dtype_str(spec, cache_config)))
    if shape != (index.num_blocks, spec.block_size, spec.head_size):
        raise Unsupported(f"{backend.get_name()}: latent cache shape {shape} is not (blocks, block_size, "
                          f"kv_lora_rank + rope_dim), the layout read back")
    kv_cache = allocate_cache(backend, shape, spec.dtype, gen)
    caches = {layer_name: kv_cache}
    index_part, picks = None, None
    if index_layer is not None and index_name is not None:
        index_part = _index_part(index_layer, index_name, config, layout, index, args, gen)
        names = f"{names} / {index_part.backend.get_name()}"
        caches[index_part.name] = index_part.cache
    else:
        picks = reused_topk(index.positions.to("cuda"), args.topk, gen)
        topk_indices[:index.num_tokens].copy_(picks)
    bind_kv_cache(caches, config.compilation_config.static_forward_context, [])
    with vllm_refusals(f"the {names} metadata builders", construction=True):
        common = common_metadata(index)
        attn_metadata = builder.build(common_prefix_len=0, common_attn_metadata=common)
        index_metadata = None if index_part is None else index_part.builder.build(common_prefix_len=0,
                                                                                  common_attn_metadata=common)

    x = torch.randn(layout.tokens, args.hidden, generator=gen, device="cuda", dtype=torch.bfloat16)
    built = BuiltDsa(module=module, attn=attn, layer_name=layer_name, index_name=index_name, config=config,
                     layout=layout, index=index, weights=weights, x=x, x_batch=x[index.rows.to("cuda")],
                     positions=index.positions.to("cuda"), kv_cache=kv_cache,
                     index_cache=None if index_part is None else index_part.cache,
                     topk_indices=topk_indices, attn_metadata=attn_metadata, index_metadata=index_metadata,
                     slot_mapping=index.slot_mapping.to("cuda"), forward_context=set_forward_context, plan=plan,
                     index_dim=args.index_dim)
    with vllm_refusals(f"the forward ({names})", construction=False):
        built.eager()
        torch.cuda.synchronize()
    take, size, mode = graph_rule(config, index, env)
    graph_error = capture_or_error(built) if take else None
    if picks is not None and not torch.equal(picks, topk_indices[:index.num_tokens]):
        raise RuntimeError(f"{DEEPSEEK_MLA.cls} as a skip layer wrote topk_indices_buffer: the picks it attends are "
                           "not the ones filled")
    built.metadata = dsa_metadata(args, built, builder, index_part, spec, size, mode, graph_error)
    built.metadata["projections"] = layers
    return built
