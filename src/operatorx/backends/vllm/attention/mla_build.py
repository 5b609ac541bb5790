"""Build an mla case through vLLM: DeepseekV2MLAAttention, the latent cache the runner would allocate, the
metadata its MLA backend's builder makes, and the timed call (imports vLLM; called from attention/mla.py).

- the MLA backend is the one vLLM picked when the module's MLAAttention was built (`attn.attn_backend`,
  get_attn_backend(use_mla=True): FLASH_ATTN_MLA first on sm90 for a bf16 cache, FLASHMLA for an fp8 one,
  which FLASH_ATTN_MLA does not take); the block size is the one it prefers
  (mla_module.set_block_size), and the layout pages by it;
- the cache is the backend's get_kv_cache_shape(num_blocks, block_size, 1, kv_lora_rank + rope_dim):
  [blocks, block_size, kv_lora_rank + rope_dim], each token's normed latent then its rope key, in the
  backend's stride order, filled with bf16 normals (an fp8 cache: their e4m3 bytes, uint8 storage;
  build.allocate_cache) and bound with bind_kv_cache;
- the metadata: the backend's builder over batch.py's index in the runner's decode-first order (the
  MLA builders split decodes, run by forward_mqa in the absorbed form, from prefills, run by
  forward_mha over up-projected keys, at their reorder_batch_threshold);
- the timed call: module.forward(positions, hidden_states, None) inside set_forward_context; a CUDA
  graph where vLLM's FULL decode graphs run (build.graph_rule), else eager.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Optional

import torch

from operatorx.backends.base import Unsupported
from operatorx.backends.torch.attention.layout import Layout, Request, plan_layout
from operatorx.backends.torch.attention.mla import MlaWeights, mla_weights, softmax_scale
from operatorx.backends.torch.memory import require_memory
from operatorx.backends.vllm.attention.batch import batch_index, cached_latents
from operatorx.backends.vllm.attention.build import (
    FILL_CHUNK_BYTES,
    allocate_cache,
    builder_split,
    cache_dtype_str,
    capture_or_error,
    common_metadata,
    graph_notes,
    graph_rule,
)
from operatorx.backends.vllm.attention.built import BuiltPaged
from operatorx.backends.vllm.attention.mla_module import (
    load_mla_weights,
    make_mla_module,
    mla_case_config,
    set_block_size,
)
from operatorx.backends.vllm.attention.module import max_position
from operatorx.backends.vllm.attention.proj import projection_kernels, quant_config_of
from operatorx.backends.vllm.attention.support import DEEPSEEK_MLA, projection_plan
from operatorx.backends.vllm.common import class_name, vllm_refusals
from operatorx.backends.vllm.env import VllmEnv
from operatorx.spec import Case
from operatorx.spec.attention import MlaArgs

__all__ = ["BuiltMla", "build_mla", "device_bytes", "WORKSPACE_TOKENS"]

#: The module's projection layers.
MLA_LAYERS = ("fused_qkv_a_proj", "q_b_proj", "kv_b_proj", "o_proj")
#: The MLA builders' chunked-prefill workspace at most (MLACommonMetadataBuilder's 64k-token cap).
WORKSPACE_TOKENS = 64 * 1024


@dataclass(kw_only=True)
class BuiltMla(BuiltPaged):
    """attn: the module's MLAAttention layer; kv_cache: the [num_blocks, block_size, kv_lora_rank + rope_dim]
    view."""

    weights: MlaWeights

    def forward(self) -> torch.Tensor:
        out: torch.Tensor = self.module(self.positions, self.x_batch, None)
        return out

    def latent_quantized(self, r: Request) -> bool:
        """Whether vLLM runs kv_b_proj as a layer over the request's latents: a request after the builder's
        decodes (forward_mha, up-projected); the decodes fold kv_b_proj's weights in (forward_mqa)."""
        decodes = getattr(self.attn_metadata, "num_decodes", None)
        if decodes is None:
            raise RuntimeError(f"{class_name(self.attn_metadata)}: no num_decodes; which requests ran the "
                               "up-projected prefill is unknown")
        position = self.index.order.index(self.layout.requests.index(r))
        return position >= int(decodes)

    def cached(self, r: Request) -> torch.Tensor:
        """fp32 [ctx, kv_lora_rank + rope_dim] of the request's cached positions, read through its blocks (an
        fp8 cache dequantized with the layer's k_scale, as the kernels read it)."""
        return cached_latents(self.kv_cache, r, float(self.attn._k_scale))


def device_bytes(args: MlaArgs, layout: Layout) -> int:
    """Weights (kv_b_proj twice: vLLM keeps W_UK_T / W_UV copies), the cache, the activations, and for a batch
    with prefills the chunked-prefill workspace and its up-projected keys and values."""
    h, heads, r, rope = args.hidden, args.heads, args.kv_lora_rank, args.rope_dim
    qk, up = args.nope + rope, heads * (args.nope + args.v)
    weights = (args.q_lora_rank * h + heads * qk * args.q_lora_rank + (r + rope) * h + 2 * up * r
               + h * heads * args.v) * 2
    cache = (layout.pool_pages + 1) * layout.page_tokens * (r + rope) * (1 if args.kv_cache_dtype == "fp8" else 2)
    t = layout.tokens
    acts = t * (2 * h + args.q_lora_rank + r + rope + 2 * heads * qk + heads * r + 2 * heads * args.v + up) * 2 * 4
    prefill = 0
    if any(req.q > 1 for req in layout.requests):
        context = min(WORKSPACE_TOKENS, sum(req.ctx for req in layout.requests))
        prefill = WORKSPACE_TOKENS * (r + rope) * 2 + 2 * context * (up + heads * qk) * 2
    return weights + cache + acts + prefill + FILL_CHUNK_BYTES * 3 + (1 << 28)


def _mla_cache(backend: Any, spec: Any, cache_config: Any, num_blocks: int, gen: torch.Generator) -> torch.Tensor:
    """The layer's latent cache (module docstring); refused when the backend's shape is not the
    [blocks, block_size, kv_lora_rank + rope_dim] one `cached` reads."""
    shape = tuple(backend.get_kv_cache_shape(num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size,
                                             cache_dtype_str=cache_dtype_str(spec, cache_config)))
    want = (num_blocks, spec.block_size, spec.head_size)
    if shape != want:
        raise Unsupported(f"{backend.get_name()}: MLA cache shape {shape} is not the (blocks, block_size, "
                          f"kv_lora_rank + rope_dim) = {want} layout this backend reads back")
    return allocate_cache(backend, shape, spec.dtype, gen)


def build_mla(case: Case, args: MlaArgs, stack: ExitStack) -> BuiltMla:
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context
    from vllm.v1.worker.utils import bind_kv_cache

    default_layout = plan_layout(args.batch)              # 16-token pages: the memory estimate and rope length
    require_memory(device_bytes(args, default_layout), "cuda")
    longest = max(r.ctx + r.q for r in default_layout.requests)
    positions_max = max_position(default_layout)
    env = VllmEnv.get()
    stack.enter_context(env.case_scope())
    config, cache_config, model_config = mla_case_config(env.config, args, positions_max)
    stack.enter_context(set_current_vllm_config(config))
    prefix = env.unique_prefix("self_attn")
    layer_name = f"{prefix}.attn"
    stack.callback(env.forget_layer, layer_name)         # registered by MLAAttention.__init__
    plan = projection_plan(args)
    assert not isinstance(plan, str), plan                   # refused in supports()
    with vllm_refusals(f"the quant config {plan.quant.cls if plan.quant else None}", construction=True):
        quant_config = quant_config_of(plan)
    with vllm_refusals(f"to build {DEEPSEEK_MLA.cls}", construction=True), torch.device("cuda"):
        module = make_mla_module(config, args, cache_config, prefix, positions_max, longest, quant_config)
    attn = module.mla_attn.mla_attn
    if attn.layer_name != layer_name:
        raise RuntimeError(f"{DEEPSEEK_MLA.cls}: its MLAAttention layer is {attn.layer_name!r}, expected "
                           f"{layer_name!r}")
    backend = attn.attn_backend
    block_size = set_block_size(config, backend)
    layout = plan_layout(args.batch, None, block_size)
    gen = torch.Generator(device="cuda").manual_seed(case.seed())
    with vllm_refusals("to load the projections", construction=True):
        weights = load_mla_weights(module, mla_weights(args, gen, "cuda"), model_config, plan)
    layers = projection_kernels(module, MLA_LAYERS, plan)

    spec = attn.get_kv_cache_spec(config)
    if spec.block_size != layout.page_tokens:
        raise Unsupported(f"{backend.get_name()}: vLLM's spec has block size {spec.block_size}; the layout pages by "
                          f"{layout.page_tokens}")
    with vllm_refusals(f"the {backend.get_name()} metadata builder", construction=True):
        builder = backend.get_builder_cls()(spec, [layer_name], config, torch.device("cuda"))
    index = batch_index(layout, getattr(builder, "reorder_batch_threshold", None))
    kv_cache = _mla_cache(backend, spec, cache_config, index.num_blocks, gen)
    bind_kv_cache({layer_name: kv_cache}, config.compilation_config.static_forward_context, [])
    with vllm_refusals(f"the {backend.get_name()} metadata builder", construction=True):
        attn_metadata = builder.build(common_prefix_len=0, common_attn_metadata=common_metadata(index))

    x = torch.randn(layout.tokens, args.hidden, generator=gen, device="cuda", dtype=torch.bfloat16)
    built = BuiltMla(module=module, attn=attn, layer_name=layer_name, config=config, layout=layout, index=index,
                     weights=weights, x=x, x_batch=x[index.rows.to("cuda")], positions=index.positions.to("cuda"),
                     kv_cache=kv_cache, attn_metadata=attn_metadata, slot_mapping=index.slot_mapping.to("cuda"),
                     forward_context=set_forward_context, plan=plan)
    with vllm_refusals(f"the forward ({backend.get_name()})", construction=False):
        built.eager()
        torch.cuda.synchronize()
    take, size, mode = graph_rule(config, index, env)
    graph_error = capture_or_error(built) if take else None
    built.metadata = _metadata(args, built, builder, spec, size, mode, graph_error)
    built.metadata["projections"] = layers
    return built


def _metadata(args: MlaArgs, b: BuiltMla, builder: Any, spec: Any, size: Optional[int], mode: str,
              graph_error: Optional[str]) -> dict[str, Any]:
    from vllm.config import CacheConfig

    from operatorx.backends.vllm.common import describe_custom_ops, describe_ir_priority
    from operatorx.backends.vllm.env import selection_env, vllm_version

    backend, impl, md = b.attn.attn_backend, b.attn.impl, b.attn_metadata
    prefill = getattr(md, "prefill", None)
    meta: dict[str, Any] = {
        "framework": f"vllm {vllm_version()}",
        "module": DEEPSEEK_MLA.path,
        "layer": b.layer_name,
        "attention_backend": {"name": backend.get_name(), "class": backend.__name__, "impl": class_name(impl),
                              "prefill_backend": class_name(getattr(b.attn, "prefill_backend", None))},
        "metadata_builder": type(builder).__name__,
        "metadata": class_name(md),
        "decode_metadata": class_name(getattr(md, "decode", None)),
        "prefill_metadata": class_name(prefill),
        "chunked_context": None if prefill is None else getattr(prefill, "chunked_context", None) is not None,
        "reorder_batch_threshold": getattr(builder, "reorder_batch_threshold", None),
        "rotary_embedding": class_name(b.module.rotary_emb),
        "softmax_scale": {"vllm": float(b.attn.scale), "reference": softmax_scale(args)},
        "fused_a_min_latency_gemm": getattr(b.module.fused_qkv_a_proj, "_use_min_latency_gemm", None),
        "kv_cache": {"spec": class_name(spec), "shape": list(b.kv_cache.shape), "stride": list(b.kv_cache.stride()),
                     "dtype": str(b.kv_cache.dtype).replace("torch.", ""), "cache_dtype": b.attn.kv_cache_dtype,
                     "scales": {"q": float(b.attn._q_scale), "k": float(b.attn._k_scale)},
                     "block_size": spec.block_size,
                     "block_size_rule": f"{backend.get_name()}.get_preferred_block_size("
                                        f"{CacheConfig.DEFAULT_BLOCK_SIZE}) = {spec.block_size}",
                     "row": f"[kv_lora_rank {args.kv_lora_rank} normed latent | rope_dim {args.rope_dim} rope key]",
                     "num_blocks": b.index.num_blocks, "reserved_blocks": "block 0 (vLLM's null block)",
                     "pages": b.layout.pages, "bytes": b.kv_cache.numel() * b.kv_cache.element_size()},
        "requests": {**b.index.region_counts(), "batch_reordered": b.index.reordered,
                     "builder_split": builder_split(md, b.index, builder)},
        "torch_compile": False,
        "cudagraph_mode": mode,
        "cuda_graph": b.graph is not None,
        "graph": b.graph is not None,
        "vllm_graph_size": size if b.graph is not None else None,
        "env": selection_env(),
        "custom_ops": describe_custom_ops(b.config),
        "ir_op_priority": describe_ir_priority(b.config),
        "synthetic_weights": "random N(0, 1/in) bf16 (mla_weights), norms near 1",
        "ctx": b.layout.ctx_summary(),
    }
    return graph_notes(meta, b.graph, size, b.index.num_tokens, graph_error)
