"""Build a gqa case through vLLM: its module, the KV cache the runner would allocate, the metadata its
backend's builder makes, and the timed call (imports vLLM; called from attention/__init__.py).

- the attention backend is the one vLLM picked when the module's `Attention` layer was built
  (`attn.attn_backend`, from v1/attention/selector.get_attn_backend);
- the KV cache is allocated as the runner's _reshape_attention_kv_cache does: the backend's
  get_kv_cache_shape(num_blocks, block_size, kv_heads, head_size, cache_dtype_str=...) laid out in its
  get_kv_cache_stride_order, in the spec's dtype (uint8 for fp8), filled with random format-valid
  values (bf16 normals; for fp8 their e4m3 bytes) and bound with v1/worker/utils.bind_kv_cache;
- the metadata: backend.get_builder_cls()(kv_cache_spec, [layer], config, device).build(0, common)
  on a CommonAttentionMetadata of batch.py's index;
- the timed call: module.forward(positions, hidden_states) inside set_forward_context with the layer's
  metadata and slot mapping (the layer writes the new K/V there: the same slots every call). A CUDA
  graph is captured where vLLM's FULL decode graphs run (every request q = 1, T within the capture
  sizes, cudagraph_mode with a full decode graph), else the call is eager (piecewise mode runs
  attention eagerly).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Optional

import torch

from operatorx.backends.base import Unsupported
from operatorx.backends.torch.attention.gqa import GqaWeights, gqa_weights
from operatorx.backends.torch.attention.layout import PAGE_TOKENS, Layout, Request, plan_layout
from operatorx.backends.torch.memory import require_memory
from operatorx.backends.vllm.attention.batch import BatchIndex, batch_index, block_offsets
from operatorx.backends.vllm.attention.built import BuiltPaged
from operatorx.backends.vllm.attention.module import case_config, load_weights, make_module, max_position
from operatorx.backends.vllm.attention.proj import projection_kernels, quant_config_of
from operatorx.backends.vllm.attention.support import ModuleChoice, projection_plan
from operatorx.backends.vllm.common import class_name, vllm_refusals
from operatorx.backends.vllm.env import VllmEnv
from operatorx.backends.vllm.graphs import CapturedCall, GraphOrEager, capture, graph_size
from operatorx.spec import Case
from operatorx.spec.attention import GqaArgs

__all__ = ["BuiltGqa", "build_gqa", "FILL_CHUNK_BYTES", "allocate_cache", "common_metadata", "graph_rule",
           "builder_split", "graph_notes", "capture_or_error", "cache_dtype_str"]

#: Most bytes of random values generated at once while filling the cache.
FILL_CHUNK_BYTES = 1 << 28


@dataclass(kw_only=True)
class BuiltGqa(BuiltPaged):
    """kv_cache: the (num_blocks, kv_heads, block_size, 2·head_dim) view."""

    weights: GqaWeights

    def forward(self) -> torch.Tensor:
        out: torch.Tensor = self.module(self.positions, self.x_batch)
        return out

    def cached(self, r: Request) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 K, V [ctx - key_start, kv_heads, head_dim] of the request's cached positions, read through
        its blocks as the kernel reads them (K the first head_dim of each token's row, V the rest), fp8
        dequantized with the layer's k/v scales."""
        d = self.attn.head_size
        blocks, offsets = (t.to(self.kv_cache.device) for t in block_offsets(r, r.key_start, r.ctx))
        rows = self.kv_cache[blocks, :, offsets]                                   # [n, kv_heads, 2d]
        k, v = rows[..., :d], rows[..., d:]
        if rows.dtype == torch.uint8:
            fp8 = torch.float8_e4m3fn
            return (k.view(fp8).float() * float(self.attn._k_scale),
                    v.view(fp8).float() * float(self.attn._v_scale))
        return k.float(), v.float()


def _device_bytes(args: GqaArgs, layout: Layout) -> int:
    h, d, t = args.hidden, args.head_dim, layout.tokens
    q_out = args.q_heads * d * (2 if args.gate else 1)
    weights = (q_out + 2 * args.kv_heads * d + args.q_heads * d) * h * 2
    cache = (layout.pool_pages + 1) * PAGE_TOKENS * 2 * args.kv_heads * d * (1 if args.kv_cache_dtype == "fp8" else 2)
    acts = t * (2 * h + q_out + 2 * args.kv_heads * d + args.q_heads * d) * 2 * 4
    return weights + cache + acts + FILL_CHUNK_BYTES * 3 + (1 << 28)


def cache_dtype_str(spec: Any, cache_config: Any) -> str:
    """The cache_dtype_str the runner hands get_kv_cache_shape: "auto" for an unquantized cache, else the
    spec's (or the cache config's) cache dtype."""
    from vllm.v1.kv_cache_interface import KVQuantMode

    if spec.kv_quant_mode == KVQuantMode.NONE:
        return "auto"
    return str(getattr(spec, "cache_dtype_str", None) or cache_config.cache_dtype)


def _kv_cache(backend: Any, spec: Any, cache_config: Any, num_blocks: int, gen: torch.Generator) -> torch.Tensor:
    """The layer's cache, laid out and filled (module docstring); refused when its logical shape is not
    the (blocks, kv_heads, block_size, 2·head_size) one every 0.26 backend uses and `cached` reads."""
    shape = tuple(backend.get_kv_cache_shape(num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size,
                                             cache_dtype_str=cache_dtype_str(spec, cache_config)))
    want = (num_blocks, spec.num_kv_heads, spec.block_size, 2 * spec.head_size)
    if shape != want:
        raise Unsupported(f"{backend.get_name()}: KV cache shape {shape} is not the (blocks, kv_heads, block_size, "
                          f"2·head_size) = {want} layout this backend reads back")
    return allocate_cache(backend, shape, spec.dtype, gen)


def allocate_cache(backend: Any, shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """The logical `shape` (blocks first) laid out in the backend's get_kv_cache_stride_order, as the runner's
    _reshape_attention_kv_cache does, and filled block by block with random format-valid values (bf16
    normals; for fp8 their e4m3 bytes)."""
    try:
        order = tuple(backend.get_kv_cache_stride_order())
        assert len(order) == len(shape)
    except (AttributeError, NotImplementedError):
        order = tuple(range(len(shape)))
    inverse = [order.index(i) for i in range(len(order))]
    cache = torch.empty([shape[i] for i in order], dtype=dtype, device="cuda").permute(*inverse)
    num_blocks = shape[0]
    per_block = cache[0].numel() * 4
    step = max(1, FILL_CHUNK_BYTES // per_block)
    for b0 in range(0, num_blocks, step):
        b1 = min(num_blocks, b0 + step)
        values = torch.randn((b1 - b0, *shape[1:]), generator=gen, device="cuda", dtype=torch.bfloat16)
        if dtype == torch.uint8:
            cache[b0:b1].copy_(values.to(torch.float8_e4m3fn).view(torch.uint8))
        elif dtype == torch.bfloat16:
            cache[b0:b1].copy_(values)
        else:
            raise Unsupported(f"kv cache dtype {dtype}: this backend fills bf16 and fp8 (uint8) caches")
    return cache


def common_metadata(index: BatchIndex) -> Any:
    from vllm.v1.attention.backend import CommonAttentionMetadata

    cuda = torch.device("cuda")
    return CommonAttentionMetadata(
        query_start_loc=index.query_start_loc.to(cuda), query_start_loc_cpu=index.query_start_loc,
        seq_lens=index.seq_lens.to(cuda), _seq_lens_cpu=index.seq_lens, _num_computed_tokens_cpu=index.num_computed,
        seq_lens_cpu_upper_bound=index.seq_lens, num_reqs=len(index.order), num_actual_tokens=index.num_tokens,
        max_query_len=index.max_query_len, max_seq_len=index.max_seq_len,
        block_table_tensor=index.block_table.to(cuda), slot_mapping=index.slot_mapping.to(cuda), causal=True,
        is_prefilling=index.is_prefilling, positions=index.positions.to(cuda))


def graph_rule(config: Any, index: BatchIndex, env: VllmEnv) -> tuple[bool, Optional[int], str]:
    """(capture, the size vLLM would pad to, cudagraph_mode's name)."""
    mode = getattr(config.compilation_config, "cudagraph_mode", None)
    name = "unset" if mode is None else str(mode)
    size = graph_size(index.num_tokens, env.capture_sizes)
    full_decode = mode is not None and mode.decode_mode().name == "FULL"
    uniform_decode = all(g == "decode" for g in index.regions) and index.max_query_len == 1
    return full_decode and uniform_decode and size is not None, size, name


def build_gqa(case: Case, args: GqaArgs, choice: ModuleChoice, stack: ExitStack) -> BuiltGqa:
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context
    from vllm.v1.worker.utils import bind_kv_cache

    layout = plan_layout(args.batch, args.window)
    require_memory(_device_bytes(args, layout), "cuda")
    env = VllmEnv.get()
    stack.enter_context(env.case_scope())
    config, cache_config, model_config = case_config(env.config, args)
    stack.enter_context(set_current_vllm_config(config))
    prefix = env.unique_prefix("self_attn")
    layer_name = f"{prefix}.attn"
    stack.callback(env.forget_layer, layer_name)         # registered by Attention.__init__
    plan = projection_plan(args)
    assert not isinstance(plan, str), plan                   # refused in supports()
    with vllm_refusals(f"the quant config {plan.quant.cls if plan.quant else None}", construction=True):
        quant_config = quant_config_of(plan)
    with vllm_refusals(f"to build {choice.cls}", construction=True), torch.device("cuda"):
        module = make_module(choice, args, cache_config, prefix, max_position(layout), quant_config)
    layers = projection_kernels(module, ("qkv_proj", "o_proj"), plan)
    attn = module.attn
    if attn.layer_name != layer_name:
        raise RuntimeError(f"{choice.cls}: its Attention layer is {attn.layer_name!r}, expected {layer_name!r}")
    gen = torch.Generator(device="cuda").manual_seed(case.seed())
    with vllm_refusals("to load the projections", construction=True):
        weights = load_weights(module, choice, gqa_weights(args, gen, "cuda"), model_config, plan)
    layers = projection_kernels(module, ("qkv_proj", "o_proj"), plan)     # some methods pick the kernel at PWAL

    backend = attn.attn_backend
    spec = attn.get_kv_cache_spec(config)
    if spec.block_size != PAGE_TOKENS:
        raise Unsupported(f"{backend.get_name()}: vLLM chose block size {spec.block_size} for this layer; the layout "
                          f"pages by {PAGE_TOKENS}")
    with vllm_refusals(f"the {backend.get_name()} metadata builder", construction=True):
        builder = backend.get_builder_cls()(spec, [layer_name], config, torch.device("cuda"))
    index = batch_index(layout, getattr(builder, "reorder_batch_threshold", None))
    kv_cache = _kv_cache(backend, spec, cache_config, index.num_blocks, gen)
    bind_kv_cache({layer_name: kv_cache}, config.compilation_config.static_forward_context, [])
    with vllm_refusals(f"the {backend.get_name()} metadata builder", construction=True):
        attn_metadata = builder.build(common_prefix_len=0, common_attn_metadata=common_metadata(index))

    x = torch.randn(layout.tokens, args.hidden, generator=gen, device="cuda", dtype=torch.bfloat16)
    positions = index.positions.to("cuda")
    if args.mrope_section is not None:              # the runner's mrope positions [3, T]: t = h = w for text
        positions = positions.expand(3, -1).contiguous()
    built = BuiltGqa(module=module, attn=attn, layer_name=layer_name, config=config, layout=layout, index=index,
                     weights=weights, x=x, x_batch=x[index.rows.to("cuda")], positions=positions,
                     kv_cache=kv_cache, attn_metadata=attn_metadata, slot_mapping=index.slot_mapping.to("cuda"),
                     forward_context=set_forward_context, plan=plan)
    with vllm_refusals(f"the forward ({backend.get_name()})", construction=False):
        built.eager()
        torch.cuda.synchronize()
    take, size, mode = graph_rule(config, index, env)
    graph_error = capture_or_error(built) if take else None
    built.metadata = _metadata(args, choice, built, builder, spec, size, mode, graph_error)
    built.metadata["projections"] = layers
    return built


def capture_or_error(built: GraphOrEager) -> Optional[str]:
    """Capture `built.eager` as its CUDA graph; None, or the capture's error (recorded; the row then times
    the eager call)."""
    try:
        built.graph = capture(built.eager)
    except RuntimeError as err:
        return f"{type(err).__name__}: {str(err).splitlines()[0][:300]}" if str(err) else repr(err)
    return None


def builder_split(md: Any, index: BatchIndex, builder: Any) -> Any:
    """A decode/prefill-splitting builder's own counts (num_decodes, ...), else why there are none."""
    if not index.reordered:
        return f"none: {type(builder).__name__} runs one kernel over the whole batch"
    return {k: getattr(md, k) for k in ("num_decodes", "num_prefills", "num_decode_tokens", "num_prefill_tokens")
            if hasattr(md, k)}


def graph_notes(meta: dict[str, Any], graph: Optional[CapturedCall], size: Optional[int], num_tokens: int,
                graph_error: Optional[str]) -> dict[str, Any]:
    """`meta` with graph_error / graph_note added where they apply."""
    if graph_error is not None:
        meta["graph_error"] = graph_error
    if graph is not None and size is not None and size != num_tokens:
        meta["graph_note"] = f"vLLM would pad T={num_tokens} to its captured size {size}; timed at T"
    if graph is None:
        meta["graph_note"] = ("eager: vLLM runs attention eagerly for this batch (piecewise graphs around it in "
                              "serving)" if graph_error is None else "eager: the capture failed")
    return meta


def _metadata(args: GqaArgs, choice: ModuleChoice, b: BuiltGqa, builder: Any, spec: Any, size: Optional[int],
              mode: str, graph_error: Optional[str]) -> dict[str, Any]:
    from operatorx.backends.vllm.common import describe_custom_ops, describe_ir_priority
    from operatorx.backends.vllm.env import selection_env, vllm_version

    backend, impl, md = b.attn.attn_backend, b.attn.impl, b.attn_metadata
    meta: dict[str, Any] = {
        "framework": f"vllm {vllm_version()}",
        "module": choice.path,
        "layer": b.layer_name,
        "attention_backend": {"name": backend.get_name(), "class": backend.__name__, "impl": class_name(impl),
                              "flash_attn_version": getattr(impl, "vllm_flash_attn_version", None)},
        "metadata_builder": type(builder).__name__,
        "metadata": class_name(md),
        "rotary_embedding": class_name(b.module.rotary_emb),
        "kv_cache": {"spec": class_name(spec), "shape": list(b.kv_cache.shape), "stride": list(b.kv_cache.stride()),
                     "dtype": str(b.kv_cache.dtype).replace("torch.", ""), "cache_dtype": b.attn.kv_cache_dtype,
                     "block_size": spec.block_size, "num_blocks": b.index.num_blocks,
                     "reserved_blocks": "block 0 (vLLM's null block)", "pages": b.layout.pages,
                     "bytes": b.kv_cache.numel() * b.kv_cache.element_size(),
                     "sliding_window": getattr(spec, "sliding_window", None)},
        "requests": {**b.index.region_counts(), "batch_reordered": b.index.reordered,
                     "builder_split": builder_split(md, b.index, builder)},
        "aot_schedule": getattr(md, "scheduler_metadata", None) is not None,
        "max_num_splits": getattr(md, "max_num_splits", None),
        "query_quant": class_name(getattr(b.attn, "query_quant", None)),
        "fused_qk_norm_rope_gate": getattr(b.module, "use_fused_qk_norm_rope_gate", None),
        "torch_compile": False,
        "cudagraph_mode": mode,
        "cuda_graph": b.graph is not None,
        "graph": b.graph is not None,
        "vllm_graph_size": size if b.graph is not None else None,
        "env": selection_env(),
        "custom_ops": describe_custom_ops(b.config),
        "ir_op_priority": describe_ir_priority(b.config),
        "synthetic_weights": "random N(0, 1/in) bf16 (gqa_weights), q/k norms near 1",
        "ctx": b.layout.ctx_summary(),
    }
    return graph_notes(meta, b.graph, size, b.index.num_tokens, graph_error)
