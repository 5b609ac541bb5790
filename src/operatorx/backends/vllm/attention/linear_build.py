"""Build a gdn / kda case through vLLM: its module, the state tensors the runner would allocate, the metadata the
GDN attention backend's builder makes, and the timed call (imports vLLM; called from attention/linear.py).

- the states: the layer's MambaSpec (get_kv_cache_spec) over layout.num_blocks blocks (the requests' slots
  and the null block), allocated as gpu_model_runner's _reshape_kv_cache_tensors does for a MambaSpec: one
  int8 buffer of num_blocks · page_size_bytes, each state (spec.shapes / spec.dtypes: conv then ssm) an
  as_strided view whose block stride is the page, bound as a list with bind_kv_cache (the layer's
  `kv_cache`); each request with a context gets random format-valid states (linear_weights.random_states),
  the others stay zero (the runner zeroes a new request's blocks). The whole buffer is snapshotted right
  after filling: the forward updates the states in place, so the check restores them first;
- the metadata: module.get_attn_backend() (GDNAttentionBackend for both), its builder over batch.py's
  index (decodes first at reorder_batch_threshold 1), block_table = each request's slot (linear_layout);
- the timed call: the module's forward from the post-norm hidden states inside set_forward_context (kda:
  into a fresh output, as KimiDecoderLayer does); a CUDA graph where vLLM's FULL decode graphs run
  (build.graph_rule, and at most the builder's decode_cudagraph_max_bs requests), else eager.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Union

import torch

from operatorx.backends.base import Unsupported
from operatorx.backends.torch.attention.layout import Layout, Request
from operatorx.backends.torch.attention.linear_weights import (
    STATE_DTYPES,
    LinearWeights,
    RequestState,
    conv_channels,
    linear_weights,
    random_states,
    state_heads,
)
from operatorx.backends.torch.memory import require_memory
from operatorx.backends.vllm.attention.batch import batch_index
from operatorx.backends.vllm.attention.build import capture_or_error, common_metadata, graph_rule
from operatorx.backends.vllm.attention.built import BuiltModule
from operatorx.backends.vllm.attention.linear_layout import state_layout, state_slot, state_slots
from operatorx.backends.vllm.attention.linear_module import (
    linear_case_config,
    load_linear_weights,
    make_linear_module,
)
from operatorx.backends.vllm.attention.linear_support import LinearModule, build_refusal, linear_module
from operatorx.backends.vllm.common import vllm_refusals
from operatorx.backends.vllm.env import VllmEnv
from operatorx.spec import Case
from operatorx.spec.attention import GdnArgs, KdaArgs

__all__ = ["BuiltLinear", "build_linear", "allocate_states", "state_views", "device_bytes"]


@dataclass(kw_only=True)
class BuiltLinear(BuiltModule):
    choice: LinearModule
    weights: LinearWeights
    raw: torch.Tensor
    """The int8 buffer every state view of the layer lives in."""
    states: list[torch.Tensor]
    """The layer's kv_cache: [conv, ssm] views, blocks first."""
    snapshot: torch.Tensor
    """`raw` as filled, before any call."""
    conv_dim_first: bool
    """vLLM's conv state layout: DS (dim, width - 1) stored, else SD (width - 1, dim)."""

    def forward(self) -> torch.Tensor:
        if self.choice.cls == "KimiGatedDeltaNetAttention":
            out = torch.empty_like(self.x_batch)
            self.module(hidden_states=self.x_batch, positions=self.positions, output=out)
            return out
        result: torch.Tensor = self.module(self.x_batch)
        return result

    def restore(self) -> None:
        """Every state back to its filled values (the forward updates them in place)."""
        self.raw.copy_(self.snapshot)

    def state(self, r: Request, filled: bool = True) -> RequestState:
        """The request's conv [conv_dim, width - 1] and ssm [heads, d_v, d_k] state as vLLM holds it: as filled
        (read from the snapshot), or as it is now."""
        views = state_views(self.snapshot, self.states) if filled else self.states
        slot = state_slot(r)
        conv = views[0][slot]
        return RequestState(conv if self.conv_dim_first else conv.t(), views[1][slot])


def state_views(raw: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Views of `raw` with the shapes, strides and offsets of the state tensors `like` (over their buffer)."""
    return [torch.as_strided(raw.view(t.dtype), t.size(), t.stride(), t.storage_offset()) for t in like]


def allocate_states(spec: Any, num_blocks: int, device: str = "cuda") -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The runner's MambaSpec allocation (module docstring): raw int8 buffer and its blocks-first state views."""
    page = int(spec.page_size_bytes)
    raw = torch.zeros(num_blocks * page, dtype=torch.int8, device=device)
    views, offset = [], 0
    for shape, dtype in zip(spec.shapes, spec.dtypes, strict=True):
        size = torch.empty((), dtype=dtype).element_size()
        assert offset % size == 0 and page % size == 0, (offset, page, dtype)
        target = (num_blocks, *shape)
        stride = torch.empty(target, device="meta").stride()
        views.append(torch.as_strided(raw.view(dtype), target, (page // size, *stride[1:]), offset // size))
        offset += stride[0] * size
    return raw, views


def _check_spec(args: Union[GdnArgs, KdaArgs], spec: Any, conv_dim_first: bool) -> None:
    """Refused when vLLM's spec is not the (conv, ssm) pair the fill and the read-back assume."""
    d, width, channels = args.head_dim, args.conv_kernel - 1, conv_channels(args)
    conv = (channels, width) if conv_dim_first else (width, channels)
    want = ((conv, (state_heads(args), d, d)), (torch.bfloat16, STATE_DTYPES[args.state_dtype]))
    have = (tuple(tuple(s) for s in spec.shapes), tuple(spec.dtypes))
    if have != want:
        raise Unsupported(f"vLLM's MambaSpec for this layer holds shapes {have[0]} dtypes {have[1]}; this backend "
                          f"fills and reads back {want[0]} {want[1]}")


def _fill(b: BuiltLinear, args: Union[GdnArgs, KdaArgs], gen: torch.Generator) -> None:
    """Random states at the slots of the requests with a context; then the snapshot."""
    with_ctx = [r for r in b.layout.requests if r.ctx > 0]
    if with_ctx:
        slots = torch.tensor([state_slot(r) for r in with_ctx], device="cuda")
        conv, ssm = random_states(args, len(with_ctx), gen, "cuda")
        b.states[0][slots] = conv if b.conv_dim_first else conv.transpose(-1, -2)
        b.states[1][slots] = ssm
    b.snapshot.copy_(b.raw)


def device_bytes(args: Union[GdnArgs, KdaArgs], layout: Layout, page_bytes: int) -> int:
    """Weights, the state buffer and its snapshot (and the fill's draws), the activations, and slack."""
    h, d = args.hidden, args.head_dim
    if isinstance(args, GdnArgs):
        weights = (conv_channels(args) + args.v_heads * d + 2 * args.v_heads) * h + args.v_heads * d * h
    else:
        p = args.heads * d
        weights = 5 * p * h + 2 * (d * h + p * d) + args.heads * h + 6 * p * args.conv_kernel
    states = (len(layout.requests) + 1) * page_bytes
    acts = layout.tokens * (2 * h + 3 * conv_channels(args)) * 4 * 4
    return 2 * weights + 3 * states + acts + (1 << 28)


def build_linear(case: Case, args: Union[GdnArgs, KdaArgs], stack: ExitStack) -> BuiltLinear:
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
    from vllm.v1.worker.utils import bind_kv_cache

    from operatorx.backends.vllm.attention.linear_meta import linear_metadata

    why = build_refusal(args)
    if why is not None:
        raise Unsupported(why)
    choice = linear_module(args)
    layout = state_layout(args.batch)
    env = VllmEnv.get()
    stack.enter_context(env.case_scope())
    config, _cache, model_config = linear_case_config(env.config, args, layout.page_tokens)
    stack.enter_context(set_current_vllm_config(config))
    prefix = env.unique_prefix("linear_attn")
    stack.callback(env.forget_layer, prefix)             # the module registers itself under its prefix
    with vllm_refusals(f"to build {choice.cls}", construction=True), torch.device("cuda"):
        module = make_linear_module(choice, args, config, prefix)
    spec = module.get_kv_cache_spec(config)
    conv_dim_first = bool(is_conv_state_dim_first())
    _check_spec(args, spec, conv_dim_first)
    require_memory(device_bytes(args, layout, int(spec.page_size_bytes)), "cuda")
    gen = torch.Generator(device="cuda").manual_seed(case.seed())
    weights = linear_weights(args, gen, "cuda")
    load_linear_weights(module, choice, weights, model_config)

    backend = module.get_attn_backend()
    with vllm_refusals(f"the {backend.get_name()} metadata builder", construction=True):
        builder = backend.get_builder_cls()(spec, [prefix], config, torch.device("cuda"))
    index = batch_index(layout, getattr(builder, "reorder_batch_threshold", None))
    if index.num_blocks != int(state_slots(layout).max()) + 1:
        raise RuntimeError(f"state blocks: {index.num_blocks} for slots up to {int(state_slots(layout).max())}")
    raw, states = allocate_states(spec, index.num_blocks)
    bind_kv_cache({prefix: states}, config.compilation_config.static_forward_context, [])
    with vllm_refusals(f"the {backend.get_name()} metadata builder", construction=True):
        md = builder.build(common_prefix_len=0, common_attn_metadata=common_metadata(index))

    x = torch.randn(layout.tokens, args.hidden, generator=gen, device="cuda", dtype=torch.bfloat16)
    built = BuiltLinear(module=module, choice=choice, layer_name=prefix, config=config, layout=layout, index=index,
                        weights=weights, x=x, x_batch=x[index.rows.to("cuda")], positions=index.positions.to("cuda"),
                        raw=raw, states=states, snapshot=torch.empty_like(raw), conv_dim_first=conv_dim_first,
                        attn_metadata=md, forward_context=set_forward_context)
    _fill(built, args, gen)
    with vllm_refusals(f"the forward ({backend.get_name()})", construction=False):
        built.eager()
        torch.cuda.synchronize()
    rule, size, mode = graph_rule(config, index, env)
    max_bs = getattr(builder, "decode_cudagraph_max_bs", None)
    take = rule and max_bs is not None and len(index.order) <= int(max_bs)
    graph_error = capture_or_error(built) if take else None
    built.restore()
    built.metadata = linear_metadata(args, built, backend, builder, spec, size, mode, graph_error)
    built.metadata["graph_decision"] = {"full_decode_rule": rule, "decode_cudagraph_max_bs": max_bs,
                                        "requests": len(index.order), "regions": index.region_counts(),
                                        "max_query_len": index.max_query_len}
    return built
