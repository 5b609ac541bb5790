"""The torch backends of gqa and mla: one attention module over a filled paged cache, checked once in fp32.

prepare (untimed): the layout of the batch (layout.py), random bf16 weights and input rows from the
case's seed, the cache filled with random values for every request's context (a format-valid bf16
cache: any values are keys and values a model could have written), the RoPE table of the new tokens'
positions, the SDPA chunks and masks (core.py). The timed call is the module's forward: projections,
norms, RoPE, the cache write of the new tokens, paged SDPA, the gate, o_proj (gqa.py, mla.py).
check: the output rows of the reference requests against reference.py's fp32 module on the same
weights, inputs and cache contents.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional, Union

import torch

from operatorx.backends.base import Check, Prepared, Unsupported
from operatorx.backends.check import fp8_projection_bound, rel_error
from operatorx.backends.refusal import library_refusal
from operatorx.backends.torch.attention.core import GATHER_BUDGET_BYTES, plan_chunks
from operatorx.backends.torch.attention.gqa import GqaModule, gqa_weights
from operatorx.backends.torch.attention.layout import Layout, Request, plan_layout
from operatorx.backends.torch.attention.mla import MlaModule, mla_weights
from operatorx.backends.torch.attention.proj import Projection, make_projection, projection_scheme
from operatorx.backends.torch.attention.reference import ReferenceRows, gqa_reference, mla_reference
from operatorx.backends.torch.attention.rope import rope_table
from operatorx.backends.torch.attention.support import refusal
from operatorx.backends.torch.memory import require_memory
from operatorx.spec import Case
from operatorx.spec.attention import GqaArgs, MlaArgs

__all__ = ["TorchGqa", "TorchMla", "ATTENTION_BOUND"]

#: ||out - ref|| / ||ref|| allowed: a bf16 module rounds after each of its steps (projections, norms,
#: RoPE, scores, softmax, PV, o_proj), each adding about bf16's half-ulp (2^-9) of relative error.
ATTENTION_BOUND = 2e-2
_BF16 = 2


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _positions(layout: Layout, device: str) -> torch.Tensor:
    """Each new token's position (ctx .. ctx + q - 1 of its request), in row order."""
    return torch.cat([torch.arange(r.ctx, r.ctx + r.q) for r in layout.requests]).to(device)


def _gathered_key_bytes(args: Union[GqaArgs, MlaArgs]) -> int:
    """Bytes one gathered key costs inside an SDPA chunk (K and V, and for prefill the repeated heads)."""
    if isinstance(args, GqaArgs):
        return 2 * args.q_heads * args.head_dim * _BF16
    return (args.heads * (args.nope + args.rope_dim + args.v) + args.kv_lora_rank + args.rope_dim) * _BF16


def _projections(args: Union[GqaArgs, MlaArgs], weights: dict[str, torch.Tensor]) -> dict[str, Projection]:
    """Each projection as the case's scheme runs it (proj.py), from its bf16 weight."""
    scheme, act_scale, weight_scale = projection_scheme(args)
    return {name: make_projection(w, scheme, act_scale, weight_scale) for name, w in weights.items()}


def _call_metadata(args: Union[GqaArgs, MlaArgs], layout: Layout, chunks: int, cache_bytes: int) -> dict[str, Any]:
    decode = sum(1 for r in layout.requests if r.q == 1)
    scheme, act_scale, _ = projection_scheme(args)
    projections = ("torch.nn.functional.linear (bf16)" if scheme == "bf16" else
                   f"torch.nn.functional.scaled_mm (block_1x128_128x128, e4m3; activations quantized in the call "
                   f"with {act_scale.dtype if act_scale else '-'} 1x128 scales)")
    return {
        "calls": {"projections": projections,
                  "attention": "torch.nn.functional.scaled_dot_product_attention over K/V gathered from the "
                               "paged cache",
                  "cache_write": "index_copy_ into the pool slots of the new tokens"},
        "form": "grouped-query" if isinstance(args, GqaArgs) else "materialized (kv_b_proj up-projects the "
                                                                  "gathered latents each call)",
        "sdpa_calls": chunks,
        "kv_cache": {"dtype": "bf16", "page_tokens": layout.pool_slots // layout.pool_pages,
                     "pages": layout.pool_pages, "layout": layout.pages, "bytes": cache_bytes},
        "requests": {"decode": decode, "prefill": len(layout.requests) - decode},
        "ctx": layout.ctx_summary(),
    }


def _check(out: torch.Tensor, ref: ReferenceRows, args: Union[GqaArgs, MlaArgs]) -> Check:
    got = out[ref.rows.to(out.device)]
    fp8 = projection_scheme(args)[0] == "fp8_block"
    what = ref.what + ("; block-FP8 projections: dequantized weights, activations quantized as the call does"
                       if fp8 else "")
    bound = fp8_projection_bound(args.TYPE) if fp8 else ATTENTION_BOUND
    return Check(rel_error(got, ref.out), bound, int(ref.rows.numel()), what)


class _TorchAttention:
    name = "torch"
    op_type = ""

    def supports(self, case: Case, device: str) -> Optional[str]:
        return refusal(case.args, device)  # type: ignore[arg-type]

    def _forward_once(self, fn: Any, device: str) -> torch.Tensor:
        try:
            out: torch.Tensor = fn()
            _sync(device)
        except (RuntimeError, NotImplementedError, ValueError) as err:
            reason = library_refusal(err)
            if reason is None:
                raise
            raise Unsupported(f"torch refused the {self.op_type} module: {reason}") from err
        return out


class TorchGqa(_TorchAttention):
    op_type = "gqa"

    def prepare(self, case: Case, device: str) -> Prepared:
        args = case.args
        assert isinstance(args, GqaArgs)
        layout = plan_layout(args.batch, args.window)
        h, d, kv = args.hidden, args.head_dim, args.kv_heads * args.head_dim
        weight_bytes = (args.q_heads * d * (3 if args.gate else 2) * h + 2 * kv * h) * _BF16
        cache_bytes = 2 * layout.pool_slots * kv * _BF16
        widest = max(r.keys for r in layout.requests) * _gathered_key_bytes(args)
        require_memory(weight_bytes + cache_bytes + layout.tokens * (h + 4 * args.q_heads * d) * _BF16 * 2
                       + min(GATHER_BUDGET_BYTES, widest) * 2, device)
        gen = torch.Generator(device=device).manual_seed(case.seed())
        bf16 = gqa_weights(args, gen, device)
        proj = _projections(args, {"q_proj": bf16.q, "k_proj": bf16.k, "v_proj": bf16.v, "o_proj": bf16.o})
        weights = replace(bf16, q=proj["q_proj"].weight, k=proj["k_proj"].weight, v=proj["v_proj"].weight,
                          o=proj["o_proj"].weight)              # as stored: what the reference reads
        x = torch.randn(layout.tokens, h, generator=gen, device=device, dtype=torch.bfloat16)
        k_cache = torch.randn(layout.pool_slots, args.kv_heads, d, generator=gen, device=device, dtype=torch.bfloat16)
        v_cache = torch.randn(layout.pool_slots, args.kv_heads, d, generator=gen, device=device, dtype=torch.bfloat16)
        rope = rope_table(_positions(layout, device), args.rope_dim, args.rope_theta, None, "neox", torch.bfloat16,
                          device)
        chunks = plan_chunks(layout, _gathered_key_bytes(args), device)
        module = GqaModule(args, x, weights, proj, k_cache, v_cache, layout.write_slots().to(device), rope, chunks)
        self._forward_once(module, device)
        state: dict[str, Any] = {"module": module}

        def fn() -> torch.Tensor:
            return state["module"]()

        def cached(r: Request) -> tuple[torch.Tensor, torch.Tensor]:
            m = state["module"]
            slots = r.slots(r.key_start, r.ctx).to(device)
            return m.k_cache[slots].float(), m.v_cache[slots].float()

        def check() -> Check:
            m = state["module"]
            ref = gqa_reference(args, m.w, m.x, layout, cached, proj["q_proj"].reference_input)
            return _check(m(), ref, args)

        meta = _call_metadata(args, layout, len(chunks), cache_bytes)
        return Prepared(fn=fn, check=check, metadata=meta, release=state.clear)


class TorchMla(_TorchAttention):
    op_type = "mla"

    def prepare(self, case: Case, device: str) -> Prepared:
        args = case.args
        assert isinstance(args, MlaArgs)
        layout = plan_layout(args.batch)
        h, heads, r = args.hidden, args.heads, args.kv_lora_rank
        weight_bytes = (args.q_lora_rank * (h + heads * (args.nope + args.rope_dim)) + (r + args.rope_dim) * h
                        + heads * (args.nope + args.v) * r + h * heads * args.v) * _BF16
        cache_bytes = layout.pool_slots * (r + args.rope_dim) * _BF16
        widest = max(q.keys for q in layout.requests) * _gathered_key_bytes(args)
        require_memory(weight_bytes + cache_bytes + layout.tokens * (h + 4 * heads * (args.nope + args.rope_dim))
                       * _BF16 * 2 + min(GATHER_BUDGET_BYTES, widest) * 2, device)
        gen = torch.Generator(device=device).manual_seed(case.seed())
        bf16 = mla_weights(args, gen, device)
        proj = _projections(args, {"q_a_proj": bf16.q_a, "kv_a_proj_with_mqa": bf16.kv_a, "q_b_proj": bf16.q_b,
                                   "kv_b_proj": bf16.kv_b, "o_proj": bf16.o})
        weights = replace(bf16, q_a=proj["q_a_proj"].weight, kv_a=proj["kv_a_proj_with_mqa"].weight,
                          q_b=proj["q_b_proj"].weight, kv_b=proj["kv_b_proj"].weight, o=proj["o_proj"].weight)
        x = torch.randn(layout.tokens, h, generator=gen, device=device, dtype=torch.bfloat16)
        cache = torch.randn(layout.pool_slots, r + args.rope_dim, generator=gen, device=device, dtype=torch.bfloat16)
        rope = None
        if args.rope and args.rope_theta is not None:
            rope = rope_table(_positions(layout, device), args.rope_dim, args.rope_theta, args.rope_scaling,
                              "interleaved", torch.bfloat16, device)
        chunks = plan_chunks(layout, _gathered_key_bytes(args), device)
        module = MlaModule(args, x, weights, proj, cache, layout.write_slots().to(device), rope, chunks)
        self._forward_once(module, device)
        state: dict[str, Any] = {"module": module}

        def fn() -> torch.Tensor:
            return state["module"]()

        def cached(req: Request) -> torch.Tensor:
            return state["module"].cache[req.slots(0, req.ctx).to(device)].float()

        def check() -> Check:
            m = state["module"]
            act = proj["o_proj"].reference_input
            quantized = proj["kv_b_proj"].act_scale is not None      # kv_b_proj up-projects every request here
            ref = mla_reference(args, m.w, m.x, layout, cached, act, (lambda _r: True) if quantized else None)
            return _check(m(), ref, args)

        meta = _call_metadata(args, layout, len(chunks), cache_bytes)
        return Prepared(fn=fn, check=check, metadata=meta, release=state.clear)
