"""Build a dsv4_attn case through vLLM: DeepseekV4FlashMLAAttention, its 1 / 3 / 5 caches as the runner lays them
out, one metadata builder per cache under one forward context, the timed call (imports vLLM; called from
attention/dsv4.py).

- caches (docs/dsv4-attention.md §3): each its own kv-cache group with its own block size, block table and
  slot mapping. Which blocks each request holds is dsv4_layout.plan_caches' (the window and state caches hold
  only their window's blocks, the earlier ones null block 0, as SlidingWindowManager leaves them: a full C4
  state over 64 x 8192 tokens would be 4.3 GB); the spec, page and shape are vLLM's own (the layer's
  get_kv_cache_spec, its backend's get_kv_cache_shape viewed with the padded page as the block stride, as the
  runner's _reshape_attention_kv_cache does, gpu/attn_utils.py:221-246), checked against dsv4_layout's. Each is
  zero-filled, then its pre-step rows written: SWA and main rows as random bf16 latents through vLLM's own
  fp8_ds_mla writer (quantize_and_insert_k_cache), index keys and fp32 [kv | score + ape] states through
  dsv4_layout.write_rows;
- batch: one BatchIndex per cache over one decode-first order (threshold 1: FLASHMLA_SPARSE_DSV4's
  reorder_batch_threshold and every other builder's split), each with that cache's block table and slot
  mapping; each builder on its layer's own get_kv_cache_spec;
- the timed call: module.forward(positions, x, None) in one forward context holding every cache's metadata by
  layer name; a CUDA graph of the whole forward where build.graph_rule says vLLM replays a FULL decode graph
  (a uniform decode batch within the capture sizes: serving's breakable cudagraph captures it in FULL mode,
  where @eager_break_during_capture does not break), else eager (serving: PIECEWISE within the capture sizes,
  attention_impl eager between graph segments; eager above them); dsv4_meta.graph_record says which on the row;
- the check reads the caches back after the fill (dsv4_layout.read_cached) for the reference, and at ratio 4
  vLLM's own selection from topk_indices_buffer (request-relative compressed entries, -1 none) in batch order.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import torch

from operatorx.backends.base import Unsupported
from operatorx.backends.torch.attention.dsv4 import Dsv4Weights, compressor_coff, dsv4_weights
from operatorx.backends.torch.attention.layout import Layout, Request, plan_layout
from operatorx.backends.torch.memory import require_memory
from operatorx.backends.vllm.attention.batch import RESERVED_BLOCKS, BatchIndex, batch_index
from operatorx.backends.vllm.attention.build import (
    FILL_CHUNK_BYTES,
    cache_dtype_str,
    capture_or_error,
    common_metadata,
    graph_rule,
)
from operatorx.backends.vllm.attention.built import BuiltPaged
from operatorx.backends.vllm.attention.dsv4_layout import dsv4_cache_specs, plan_caches, read_cached, write_rows
from operatorx.backends.vllm.attention.dsv4_module import (
    AUX_STREAMS,
    DSV4_ATTENTION,
    FP8_LAYERS,
    UNUSED_INDEX_TOPK,
    check_dsv4_module,
    dsv4_case_config,
    effective_ratio,
    load_dsv4_weights,
    make_dsv4_module,
)
from operatorx.backends.vllm.attention.dsv4_support import dsv4_projection_plan
from operatorx.backends.vllm.attention.module import max_position
from operatorx.backends.vllm.attention.proj import projection_kernels, quant_config_of
from operatorx.backends.vllm.common import vllm_refusals
from operatorx.backends.vllm.env import VllmEnv
from operatorx.spec import Case
from operatorx.spec.attention import Dsv4AttnArgs

__all__ = ["BuiltDsv4", "CacheGroup", "build_dsv4", "dsv4_device_bytes", "DECODE_THRESHOLD", "DS_MLA_DIM"]

#: Every builder's decode split: one new token (FlashMLA-V4's reorder_batch_threshold, the SWA, indexer and
#: compressor builders' decode_threshold without speculative decoding).
DECODE_THRESHOLD = 1
#: The head dim of vLLM's fp8_ds_mla writer (quantize_and_insert_k_cache asserts it).
DS_MLA_DIM = 512


@dataclass
class CacheGroup:
    """One of the layer's caches: its vLLM layer, spec and backend, dsv4_layout's plan of its blocks, the batch
    at its block size, the tensor, its builder and metadata."""

    kind: str
    """A key of dsv4_layout.CACHE_KINDS."""
    name: str
    layer: Any
    """The AttentionLayerBase that owns it (its kv_cache is bound here)."""
    spec: Any
    backend: Any
    plan: Any
    """dsv4_layout.CachePlan."""
    index: BatchIndex
    tensor: torch.Tensor
    """The runner's view: get_kv_cache_shape with the padded page as the block stride."""
    builder: Any = None
    metadata: Any = None


@dataclass(kw_only=True)
class BuiltDsv4(BuiltPaged):
    """attn: the module itself (DeepseekV4Attention is the attention layer); kv_cache / slot_mapping: the SWA
    cache's."""

    weights: Dsv4Weights
    caches: dict[str, CacheGroup]
    """By kind (dsv4_layout.CACHE_KINDS)."""
    topk_indices: torch.Tensor
    """The model's int32 [max_num_batched_tokens, index_topk] buffer the indexer writes, in batch order."""
    aux_streams: Optional[list[Any]]
    cached: Any = None
    """dsv4_layout.read_cached's Dsv4Cached of the filled caches (the reference's input)."""
    slots_on_device: dict[str, torch.Tensor] = field(repr=False)
    """Each cache layer's slot mapping on the GPU, made at build: a serving step hands vLLM device tensors, so
    a copy from the host in every timed call would be the harness's cost, not the module's."""

    def layer_metadata(self) -> dict[str, Any]:
        return {g.name: g.metadata for g in self.caches.values()}

    def slot_mappings(self) -> dict[str, torch.Tensor]:
        return self.slots_on_device

    def forward(self) -> torch.Tensor:
        out: torch.Tensor = self.module(self.positions, self.x_batch, None)
        return out

    def selection(self, r: Request, pick: torch.Tensor) -> torch.Tensor:
        """vLLM's selected compressed entries (request-relative, -1 none) for the request's new tokens `pick`
        (offsets), from the buffer's rows in batch order."""
        batch_row = torch.argsort(self.index.rows)                     # layout row -> batch row
        rows = batch_row[pick.cpu() + r.row0].to(self.topk_indices.device)
        return self.topk_indices[rows].long()


def dsv4_device_bytes(args: Dsv4AttnArgs, layout: Layout, positions: int, max_tokens: int) -> int:
    """A rough upper bound: weights (block FP8 one byte, bf16 compressors two), the caches at their padded
    pages (every block, windows not subtracted), the fp32 rope table (original_max · factor positions), the
    topk buffer, the prefill gather workspace (4 requests x (entries + window + max tokens) x 512 bf16),
    C128's index buffers, activations, the fill chunks and 1 GiB."""
    h, hd, heads, q_lora, t = args.hidden, args.head_dim, args.heads, args.q_lora_rank, layout.tokens
    r = effective_ratio(args)
    weights = (q_lora + hd) * h + heads * hd * q_lora + args.o_groups * args.o_lora_rank * (heads * hd // args.o_groups)
    weights += h * args.o_groups * args.o_lora_rank
    if r > 1:
        weights += 2 * 2 * compressor_coff(r) * hd * h
    if r == 4 and args.index_heads and args.index_dim:
        ih, idim = args.index_heads, args.index_dim
        weights += ih * idim * q_lora + 2 * ih * h + 2 * 2 * 2 * idim * h
    cache = 0
    for spec in dsv4_cache_specs(args):
        blocks = sum(-(-(req.ctx + req.q) // spec.block_tokens) for req in layout.requests) + 1
        cache += blocks * spec.page_bytes
    scaling = args.rope_scaling
    table = int(scaling.original_max * scaling.factor if scaling is not None else positions) * args.rope_dim * 4
    topk = max_tokens * (args.topk or UNUSED_INDEX_TOPK) * 4
    prefill = 4 * (positions // r + args.window + max_tokens) * hd * 2 if any(q.q > 1 for q in layout.requests) else 0
    c128 = 2 * max_tokens * (-(-positions // 128) + 128) * 4 if r == 128 else 0
    acts = t * (2 * h + q_lora + hd + 2 * 128 * hd + 2 * args.o_groups * args.o_lora_rank) * 4 * 2
    return int(weights + cache + table + topk + prefill + c128 + acts + FILL_CHUNK_BYTES * 3 + (1 << 30))


def _view(spec: Any, backend: Any, num_blocks: int, cache_config: Any) -> torch.Tensor:
    """The cache as the runner views it: a zeroed buffer of num_blocks padded pages, get_kv_cache_shape's
    (blocks, storage block, width) with the page as the block stride (gpu/attn_utils.py:221-246)."""
    shape = tuple(backend.get_kv_cache_shape(num_blocks, int(spec.storage_block_size), spec.num_kv_heads,
                                             spec.head_size, cache_dtype_str=cache_dtype_str(spec, cache_config)))
    try:
        order = tuple(backend.get_kv_cache_stride_order())
    except (AttributeError, NotImplementedError):
        order = tuple(range(len(shape)))
    if order != tuple(range(len(shape))) or len(shape) != 3 or shape[0] != num_blocks:
        raise Unsupported(f"{backend.get_name()}: kv cache shape {shape} order {order}; this backend lays out "
                          "(blocks, block, width) caches only")
    elem = torch.empty((), dtype=spec.dtype).element_size()
    page = int(spec.page_size_bytes)
    if page % elem or shape[1] * shape[2] * elem > page:
        raise Unsupported(f"{backend.get_name()}: page {page} B does not hold {shape[1:]} {spec.dtype}")
    raw = torch.zeros(num_blocks * page, dtype=torch.uint8, device="cuda")
    return torch.as_strided(raw.view(spec.dtype), size=shape, stride=(page // elem, shape[2], 1))


def _layers(module: Any) -> dict[str, Any]:
    """The module's cache layers by kind (the ones it built)."""
    out = {"swa": module.swa_cache_layer}
    if module.compressor is not None:
        out["main"] = module
        out["state"] = module.compressor.state_cache
    if module.indexer is not None:
        out["index_keys"] = module.indexer.k_cache
        out["index_state"] = module.indexer.compressor.state_cache
    return out


def _raw_slots(plan: Any, layout: Layout, order: tuple[int, ...]) -> torch.Tensor:
    """The runner's slot_mapping of a group (int64 [T], batch order): each new position's slot at the group's
    block size through its block table. The compressed groups' builders turn it into entry slots themselves
    (get_compressed_slot_mapping) and read only its sign elsewhere (C128's is_valid_token)."""
    bt = int(plan.spec.block_tokens)
    out = []
    for i in order:
        r, own = layout.requests[i], plan.requests[i]
        pos = torch.arange(r.ctx, r.ctx + r.q, dtype=torch.int64)
        table = torch.tensor(own.pages, dtype=torch.int64) + RESERVED_BLOCKS
        out.append(table[pos // bt] * bt + pos % bt)
    return torch.cat(out)


def _group(kind: str, layer: Any, plans: Any, base: BatchIndex, config: Any, cache_config: Any,
           prefix: str) -> CacheGroup:
    """One cache (module docstring), checked against dsv4_layout's spec of it, allocated, not yet filled."""
    plan = plans.plans[kind]
    mine = plan.spec
    spec = layer.get_kv_cache_spec(config)
    backend = layer.get_attn_backend()
    name = mine.layer_name(prefix)
    vllm_side = (layer.prefix, int(spec.block_size), int(spec.storage_block_size), int(spec.page_size_bytes),
                 spec.dtype)
    ours = (name, mine.block_tokens, mine.stored, mine.page_bytes, mine.dtype)
    if vllm_side != ours:
        raise RuntimeError(f"{backend.get_name()} {kind}: vLLM's (layer, block, stored, page bytes, dtype) "
                           f"{vllm_side}, dsv4_layout's {ours}")
    layout = plans.layout
    index = replace(base, block_table=plan.block_table(base.order), num_blocks=plan.num_blocks,
                    slot_mapping=(plans.slot_mapping(kind, base.order) if mine.ratio == 1
                                  else _raw_slots(plan, layout, base.order)))
    tensor = _view(spec, backend, plan.num_blocks, cache_config)
    if tuple(tensor.shape) != mine.shape(plan.num_blocks) or tuple(tensor.stride()) != mine.strides():
        raise RuntimeError(f"{backend.get_name()} {kind}: vLLM's view {tuple(tensor.shape)} / "
                           f"{tuple(tensor.stride())}, dsv4_layout's {mine.shape(plan.num_blocks)} / {mine.strides()}")
    return CacheGroup(kind, name, layer, spec, backend, plan, index, tensor)


def _write_ds_mla(cache: torch.Tensor, slots: torch.Tensor, block: int, gen: torch.Generator) -> None:
    """Random bf16 latents stored at `slots` by vLLM's own fp8_ds_mla writer, chunk by chunk."""
    from vllm.models.deepseek_v4.common.ops import quantize_and_insert_k_cache

    flat = cache.view(cache.shape[0], -1)             # [blocks, block · 584] with the padded page stride
    step = max(1, FILL_CHUNK_BYTES // (DS_MLA_DIM * 4))
    for s0 in range(0, int(slots.numel()), step):
        part = slots[s0:s0 + step].to("cuda")
        rows = torch.randn(part.numel(), DS_MLA_DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
        quantize_and_insert_k_cache(rows, flat, part, block_size=block)


def _fill(g: CacheGroup, index_dim: Optional[int], gen: torch.Generator) -> None:
    """The rows a request holds before this step (dsv4_layout's fill_slots: the window's for SWA and the
    states, every entry and key for the main and indexer caches): random bf16 latents through vLLM's writer
    (SWA, main), normal keys through dsv4_layout.write_rows (index keys, quantized as vLLM stores them),
    fp32 normals for the [kv | score + ape] states."""
    n = len(g.plan.requests)
    if g.kind in ("swa", "main"):
        slots = torch.cat([g.plan.fill_slots(i) for i in range(n)])
        if slots.numel():
            _write_ds_mla(g.tensor, slots, int(g.spec.storage_block_size), gen)
        return
    width = int(g.plan.spec.width) if g.kind != "index_keys" else index_dim
    assert width is not None
    for i in range(n):
        count = int(g.plan.fill_slots(i).numel())
        if count:
            write_rows(g.tensor, g.plan, i, torch.randn(count, width, generator=gen, device="cuda",
                                                        dtype=torch.float32))


def _caches(module: Any, args: Dsv4AttnArgs, layout: Layout, config: Any, cache_config: Any, prefix: str,
            gen: torch.Generator) -> tuple[dict[str, CacheGroup], Any]:
    """The layer's caches (module docstring), laid out and filled, not yet bound; and dsv4_layout's plans."""
    plans = plan_caches(args, layout)
    layers = _layers(module)
    if set(layers) != set(plans.plans):
        raise RuntimeError(f"{DSV4_ATTENTION.cls}: caches {sorted(layers)}, dsv4_layout plans {sorted(plans.plans)}")
    base = batch_index(layout, DECODE_THRESHOLD)
    groups = {kind: _group(kind, layers[kind], plans, base, config, cache_config, prefix) for kind in plans.plans}
    for g in groups.values():
        _fill(g, args.index_dim, gen)
    return groups, plans


def build_dsv4(case: Case, args: Dsv4AttnArgs, stack: ExitStack) -> BuiltDsv4:
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context
    from vllm.utils.deep_gemm import has_deep_gemm
    from vllm.v1.worker.utils import bind_kv_cache

    if not has_deep_gemm():
        raise Unsupported("DeepGEMM is not installed: vLLM's DeepSeek-V4 o_proj (wo_a fp8_einsum) and its indexer's "
                          "logits need it")
    layout = plan_layout(args.batch, args.window)       # requests and rows; each cache's blocks: plan_caches
    positions_max = max_position(layout)
    longest = max(r.ctx + r.q for r in layout.requests)
    env = VllmEnv.get()
    stack.enter_context(env.case_scope())
    prefix = env.unique_prefix("attn")                 # operatorx.layers.N.attn: one integer, the layer's index
    plan = dsv4_projection_plan(args)
    assert not isinstance(plan, str), plan                   # refused in supports()
    with vllm_refusals(f"the quant config {plan.quant.cls if plan.quant else None}", construction=True):
        quant_config = quant_config_of(plan)
    config, cache_config, model_config = dsv4_case_config(env.config, args, prefix, positions_max, layout.tokens,
                                                          len(layout.requests), plan, quant_config)
    max_tokens = int(config.scheduler_config.max_num_batched_tokens)
    require_memory(dsv4_device_bytes(args, layout, positions_max, max_tokens), "cuda")
    stack.enter_context(set_current_vllm_config(config))
    names = [prefix, f"{prefix}.swa_cache", f"{prefix}.compressor.state_cache", f"{prefix}.indexer.k_cache",
             f"{prefix}.indexer.compressor.state_cache"]
    for name in names:
        stack.callback(env.forget_layer, name)
    topk_indices = torch.full((max_tokens, int(config.model_config.hf_config.index_topk)), -1, dtype=torch.int32,
                              device="cuda")
    streams = [torch.cuda.Stream() for _ in range(AUX_STREAMS)]
    with vllm_refusals(f"to build {DSV4_ATTENTION.cls} (DeepSeek-V4)", construction=True), torch.device("cuda"):
        module = make_dsv4_module(config, prefix, topk_indices, streams)
    check_dsv4_module(module, args, prefix, longest)
    gen = torch.Generator(device="cuda").manual_seed(case.seed())
    with vllm_refusals("to load the projections", construction=True):
        weights = load_dsv4_weights(module, dsv4_weights(args, gen, "cuda"), model_config, plan)
    layers = projection_kernels(module, FP8_LAYERS, plan)
    if module.indexer is not None:
        layers["layers"]["indexer.wq_b"] = projection_kernels(module.indexer, ("wq_b",), plan)["layers"]["wq_b"]

    groups, plans = _caches(module, args, layout, config, cache_config, prefix, gen)
    bind_kv_cache({g.name: g.tensor for g in groups.values()}, config.compilation_config.static_forward_context, [])
    for g in groups.values():
        if g.layer.kv_cache is not g.tensor:
            raise RuntimeError(f"bind_kv_cache did not give {g.name} its cache")
    with vllm_refusals("the DeepSeek-V4 metadata builders", construction=True):
        for g in groups.values():
            g.builder = g.backend.get_builder_cls()(g.spec, [g.name], config, torch.device("cuda"))
        for g in groups.values():
            g.metadata = g.builder.build(common_prefix_len=0, common_attn_metadata=common_metadata(g.index))
    cached = read_cached(args, plans, {kind: g.tensor for kind, g in groups.items()})

    swa = groups["swa"]
    slots = {g.name: g.index.slot_mapping.to("cuda") for g in groups.values()}
    x = torch.randn(layout.tokens, args.hidden, generator=gen, device="cuda", dtype=torch.bfloat16)
    built = BuiltDsv4(module=module, attn=module, layer_name=prefix, config=config, layout=layout,
                      index=swa.index, weights=weights, x=x, x_batch=x[swa.index.rows.to("cuda")],
                      positions=swa.index.positions.to("cuda"), kv_cache=swa.tensor, slot_mapping=slots[swa.name],
                      slots_on_device=slots, attn_metadata=groups.get("main", swa).metadata,
                      forward_context=set_forward_context, plan=plan, caches=groups, topk_indices=topk_indices,
                      aux_streams=streams, cached=cached)
    with vllm_refusals(f"the forward ({module.backend_cls.get_name()})", construction=False):
        built.eager()
        torch.cuda.synchronize()
    take, size, mode = graph_rule(config, swa.index, env)
    graph_error = capture_or_error(built) if take else None
    from operatorx.backends.vllm.attention.dsv4_meta import dsv4_metadata

    built.metadata = dsv4_metadata(args, built, size, mode, graph_error)
    built.metadata["projections"] = layers
    return built
