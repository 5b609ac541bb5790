"""Build one vLLM MoE block for a moe case (imports vLLM; called from moe.py).

Wired as vLLM 0.26's model blocks wire it (quant_map.gate_wiring picks the block):
- DeepSeek-V3 style (bf16 gate, sigmoid scoring): `GateLinear` gate handed to `FusedMoE` (the
  runner applies it) + fp32 `e_score_correction_bias`, grouped_topk, routed scaling on the routed
  output (DeepseekV2DecoderLayer passes apply_routed_scale_to_output=True on CUDA), shared
  expert = DeepseekV2MLP;
- DeepSeek-V4 style (sqrtsoftplus): bf16 `GateLinear` with fp32 logits handed to `FusedMoE`,
  correction bias or a `tid2eid` hash table (`FusedMoE(hash_indices_table=)`, routed by the token
  ids given to `forward(input_ids=)`), routed scaling in the top-k weights;
- Qwen style (bf16 gate, softmax): `ReplicatedLinear` gate handed to `FusedMoE`, top-k, shared
  expert = Qwen2MoeMLP / Qwen3NextMLP whose output is scaled by sigmoid(shared_expert_gate(x))
  when the case has a shared gate (the gate lives in the MLP, as on CUDA: the runner's own
  `shared_expert_gate` is only for ROCm's fused shared expert);
- GLM-4.5 style (fp32 gate, grouped top-k): `Glm4MoE` builds the gate as `nn.Linear(dtype=fp32)`,
  calls it on `hidden_states.to(fp32)` itself and hands the logits to `FusedMoE(
  router_logits_dtype=fp32, apply_routed_scale_to_output=True)` (the runner scales the routed
  output, not the top-k weights);
- MiniMax-M2 style (fp32 gate, top-k): `MiniMaxM2MoE` builds `GateLinear(params_dtype=fp32,
  out_dtype=fp32)`, calls it on the bf16 hidden states and hands the fp32 logits over.
The expert activation goes to `FusedMoE(activation=, swiglu_limit=, swiglu_alpha=, swiglu_beta=)`
(quant_map.moe_activation); the shared MLP's act-and-mul follows it (DeepseekV4MLP uses
`SiluAndMulWithClamp` for the clamped SiLU). The block runs inside vLLM's forward context.

A forced routing distribution replaces the ids the router chose, after the router has run
(the router's weights stay): `RouterHook` wraps the router's `select_experts` on the instance.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional, cast

import torch
import torch.nn.functional as F
from torch import nn

from operatorx.backends.vllm.common import vllm_refusals
from operatorx.backends.vllm.quant_map import GateWiring, MoeAct, gate_wiring, moe_activation
from operatorx.backends.vllm.shards import shard_tensors
from operatorx.backends.vllm.weights import QuantMatrix, load_params, quantize_matrix, scale_name
from operatorx.spec.moe import GroupedTopK, HashSelect, MoeArgs

__all__ = ["SharedMLP", "MoeBlock", "RouterHook", "build_block", "expert_tensors", "shared_tensors", "hash_table",
           "pad_to_params"]


def _act_and_mul(act: MoeAct) -> nn.Module:
    """The shared MLP's act-and-mul module for the experts' activation (vLLM's CustomOps)."""
    from vllm.model_executor.layers.activation import GeluAndMul, SiluAndMul, SiluAndMulWithClamp

    if act.shared == "SiluAndMul":
        return SiluAndMul()
    if act.shared == "GeluAndMul":
        return GeluAndMul()
    if act.shared == "GeluAndMul(tanh)":
        return GeluAndMul(approximate="tanh")
    if act.shared == "SiluAndMulWithClamp":
        assert act.limit is not None
        return SiluAndMulWithClamp(act.limit, 1.0 if act.alpha is None else act.alpha,
                                   0.0 if act.beta is None else act.beta)
    raise ValueError(f"no shared-MLP form of {act.vllm_name}")


class SharedMLP(nn.Module):
    """DeepseekV2MLP / Qwen2MoeMLP: merged gate_up → act-and-mul → down (→ × sigmoid gate)."""

    def __init__(self, hidden: int, inter: int, act: MoeAct, quant_config: Any, prefix: str,
                 expert_gate: Optional[nn.Module] = None):
        super().__init__()
        from vllm.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear

        self.gate_up_proj = MergedColumnParallelLinear(hidden, [inter] * 2, bias=False, quant_config=quant_config,
                                                       prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(inter, hidden, bias=False, quant_config=quant_config,
                                           reduce_results=False, prefix=f"{prefix}.down_proj")
        self.act_fn = _act_and_mul(act)
        self.expert_gate = expert_gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        out, _ = self.down_proj(self.act_fn(gate_up))
        if self.expert_gate is not None:
            out = F.sigmoid(self.expert_gate(x)[0]) * out
        return out


class MoeBlock(nn.Module):
    def __init__(self, gate: nn.Module, experts: nn.Module, shared: Optional[SharedMLP],
                 wiring: Optional[GateWiring] = None):
        super().__init__()
        self.gate, self.experts, self.shared = gate, experts, shared
        self.wiring = wiring
        self.input_ids: Optional[torch.Tensor] = None
        """Token ids a hash-routed layer routes by (DeepseekV4MoE.forward's input_ids)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.wiring
        ids = {} if self.input_ids is None else {"input_ids": self.input_ids}
        if w is None or not w.external:          # the runner holds the gate and applies it
            return self.experts(hidden_states=x, router_logits=x, **ids)
        if w.style == "glm4_moe":                # Glm4MoE.forward: fp32 nn.Linear on the upcast input
            logits = self.gate(x.to(dtype=torch.float32))
        else:                                    # MiniMaxM2MoE.forward: GateLinear returns (logits, bias)
            logits, _ = self.gate(x)
        return self.experts(hidden_states=x, router_logits=logits, **ids)


class RouterHook:
    """Wraps `router.select_experts`: optionally records, optionally forces the ids."""

    def __init__(self, inner: Any, forced: Optional[torch.Tensor]):
        self.inner, self.forced = inner, forced
        self._forced_as: dict[torch.dtype, torch.Tensor] = {}
        self.record = False
        self.seen: Optional[dict[str, torch.Tensor]] = None
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        weights, ids = self.inner(*args, **kwargs)
        self.calls += 1
        chosen = ids
        if self.forced is not None:
            f = self._forced_as.get(ids.dtype)
            if f is None or f.device != ids.device:
                f = self.forced.to(device=ids.device, dtype=ids.dtype).contiguous()
                self._forced_as[ids.dtype] = f
            if f.shape != ids.shape:
                raise RuntimeError(f"forced ids {tuple(f.shape)} do not match the router's {tuple(ids.shape)}")
            ids = f
        if self.record:
            self.seen = {"weights": weights.detach().clone(), "ids": ids.detach().clone(),
                         "router_ids": chosen.detach().clone()}
        return weights, ids


def _accepted(fn: Any, kwargs: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Keep the kwargs `fn` takes (vLLM's factory gains and loses options between releases)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return kwargs, []
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return kwargs, []
    dropped = [k for k in kwargs if k not in params]
    return {k: v for k, v in kwargs.items() if k in params}, dropped


def _gate(gw: GateWiring, h: int, num: int, prefix: str) -> nn.Module:
    from vllm.model_executor.layers.linear import ReplicatedLinear

    if gw.style == "glm4_moe":
        return nn.Linear(h, num, bias=False, dtype=torch.float32)
    if gw.gate_cls == "GateLinear":
        from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear

        if gw.params_fp32:      # MiniMaxM2MoE
            return GateLinear(h, num, bias=False, params_dtype=torch.float32, out_dtype=torch.float32,
                              prefix=f"{prefix}.gate")
        return GateLinear(h, num, out_dtype=torch.float32 if gw.logits_fp32 else None, prefix=f"{prefix}.gate")
    return ReplicatedLinear(h, num, bias=False, quant_config=None, prefix=f"{prefix}.gate")


def build_block(args: MoeArgs, quant_config: Any, prefix: str, shared_unquantized: bool = False
                ) -> tuple[MoeBlock, dict[str, Any]]:
    """Construct gate, shared MLP and FusedMoE (on the current device); returns the wiring facts.

    `shared_unquantized`: the checkpoint leaves the shared MLP in bf16 (an ignored layer of its
    quant config); vLLM then builds it with UnquantizedLinearMethod, as quant_config=None does."""
    from vllm.model_executor.layers.fused_moe import FusedMoE
    from vllm.model_executor.layers.linear import ReplicatedLinear

    e, r, h = args.experts, args.router, args.hidden
    gw, act = gate_wiring(args), moe_activation(args.activation)
    if isinstance(gw, str) or isinstance(act, str):     # quant_map refused these before any build
        raise ValueError(gw if isinstance(gw, str) else act)
    with vllm_refusals("to build the router gate", construction=True):
        gate = _gate(gw, h, e.num, prefix)
        bias = nn.Parameter(torch.empty(e.num, dtype=torch.float32), requires_grad=False) if r.bias else None
        # nn.Module.__setattr__'s stub takes Tensor | Module only; torch accepts None (plain attribute)
        gate.e_score_correction_bias = bias  # type: ignore[assignment]
        table = None
        if isinstance(r.select, HashSelect):     # DeepseekV4MoE: gate.tid2eid [vocab, top_k] int32
            table = nn.Parameter(torch.zeros(r.select.vocab, e.top_k, dtype=torch.int32), requires_grad=False)
            gate.tid2eid = table
    shared = None
    if args.shared is not None:
        s = args.shared
        expert_gate = None
        if s.gate == "sigmoid":
            expert_gate = ReplicatedLinear(h, 1, bias=False, quant_config=None, prefix=f"{prefix}.shared_expert_gate")
        with vllm_refusals("to build the shared-expert MLP", construction=True):
            shared = SharedMLP(h, s.inter * s.count, act, None if shared_unquantized else quant_config,
                               f"{prefix}.shared_experts", expert_gate)
    grouped = isinstance(r.select, GroupedTopK)
    kwargs: dict[str, Any] = {
        "num_experts": e.num, "top_k": e.top_k, "hidden_size": h, "intermediate_size": e.inter,
        "renormalize": bool(r.renormalize), "quant_config": quant_config, "prefix": f"{prefix}.experts",
        "use_grouped_topk": grouped, "scoring_func": r.scoring,
        "routed_scaling_factor": float(r.scale) if r.scale is not None else 1.0,
        "e_score_correction_bias": bias, "shared_experts": shared, **act.fused_moe_kwargs(),
    }
    if e.bias:
        kwargs["has_bias"] = True
    if not gw.external:
        kwargs["gate"] = gate
    if gw.routed_scale_on_output:
        kwargs["apply_routed_scale_to_output"] = True
    if table is not None:
        kwargs["hash_indices_table"] = table
    if grouped:
        assert isinstance(r.select, GroupedTopK)
        kwargs.update(num_expert_group=r.select.groups, topk_group=r.select.topk_groups)
    if gw.logits_fp32:
        kwargs["router_logits_dtype"] = torch.float32
    elif gw.style == "deepseek_v2":
        kwargs["router_logits_dtype"] = getattr(gate, "out_dtype", None)
    kwargs, dropped = _accepted(FusedMoE, kwargs)
    needed = {"gate", "shared_experts", "activation", "has_bias", "swiglu_limit", "swiglu_alpha", "swiglu_beta",
              "apply_routed_scale_to_output", "router_logits_dtype", "hash_indices_table"}
    if needed & set(dropped):
        raise RuntimeError(f"this vLLM's FusedMoE takes no {sorted(needed & set(dropped))}: the block wiring "
                           "here needs them")
    with vllm_refusals("to build FusedMoE", construction=True):
        runner = FusedMoE(**kwargs)
    styles = {"deepseek_v2": "deepseek_v3 (DeepseekV2MoE)",
              "deepseek_v4": "deepseek_v4 (DeepseekV4MoE: GateLinear fp32 logits, sqrtsoftplus"
                             + (", hash table tid2eid routing by token id)" if table is not None else ")"),
              "qwen2_moe": "qwen (Qwen2MoeSparseMoeBlock / Qwen3NextSparseMoeBlock)",
              "glm4_moe": "glm4_moe (Glm4MoE: fp32 nn.Linear gate on the fp32-cast input, routed scale on output)",
              "minimax_m2": "minimax_m2 (MiniMaxM2MoE: fp32 GateLinear)"}
    wiring = {
        "style": styles[gw.style],
        "gate": type(gate).__name__, "gate_params": "fp32" if gw.params_fp32 else "bf16",
        "gate_logits": "fp32" if gw.logits_fp32 else "bf16",
        "gate_called_by": "the block (logits handed to FusedMoE)" if gw.external else "the MoE runner",
        "routed_scale_on_output": gw.routed_scale_on_output,
        "activation": act.fused_moe_kwargs(),
        "shared": None if shared is None else ("Qwen2MoeMLP-like with sigmoid expert gate"
                                              if shared.expert_gate is not None else "DeepseekV2MLP-like"),
        "shared_act": None if shared is None else type(shared.act_fn).__name__,
        "fused_moe_kwargs_dropped": dropped,
    }
    return MoeBlock(gate, runner, shared, gw), wiring


def _expert_scale_names(scheme: str) -> Optional[str]:
    return scale_name(scheme)


def expert_tensors(args: MoeArgs, scheme: str, gen: torch.Generator, scale_dtype: str = "fp32"
                   ) -> tuple[dict[str, torch.Tensor], list[tuple[QuantMatrix, QuantMatrix]]]:
    """Checkpoint tensors for RoutedExperts (w13 = gate rows then up rows) and per-expert copies."""
    e, h = args.experts, args.hidden
    inter = e.inter
    per_expert: list[tuple[QuantMatrix, QuantMatrix]] = []
    for _ in range(e.num):
        w1 = torch.randn(2 * inter, h, generator=gen, device="cuda", dtype=torch.bfloat16) / h ** 0.5
        w2 = torch.randn(h, inter, generator=gen, device="cuda", dtype=torch.bfloat16) / inter ** 0.5
        per_expert.append((quantize_matrix(w1, scheme, (inter, inter), scale_dtype),
                           quantize_matrix(w2, scheme, None, scale_dtype)))
    tensors = {"w13_weight": torch.stack([a.q for a, _ in per_expert]),
               "w2_weight": torch.stack([b.q for _, b in per_expert])}
    name = _expert_scale_names(scheme)
    if name is not None:
        tensors[f"w13_{name}"] = torch.stack([a.scale for a, _ in per_expert])   # type: ignore[misc]
        tensors[f"w2_{name}"] = torch.stack([b.scale for _, b in per_expert])    # type: ignore[misc]
    return tensors, per_expert


SharedRef = tuple[QuantMatrix, QuantMatrix, Optional[torch.Tensor]]


def shared_tensors(args: MoeArgs, scheme: str, gen: torch.Generator, scale_dtype: str = "fp32"
                   ) -> tuple[dict[str, dict[str, torch.Tensor]], SharedRef]:
    """Checkpoint tensors for the shared MLP's two projections (+ its sigmoid gate)."""
    s = args.shared
    assert s is not None
    h, inter = args.hidden, s.inter * s.count
    w1 = torch.randn(2 * inter, h, generator=gen, device="cuda", dtype=torch.bfloat16) / h ** 0.5
    w2 = torch.randn(h, inter, generator=gen, device="cuda", dtype=torch.bfloat16) / inter ** 0.5
    q1, q2 = quantize_matrix(w1, scheme, (inter, inter), scale_dtype), quantize_matrix(w2, scheme, None, scale_dtype)
    name = scale_name(scheme)
    out: dict[str, dict[str, torch.Tensor]] = {"gate_up_proj": {"weight": q1.q}, "down_proj": {"weight": q2.q}}
    if name is not None:
        out["gate_up_proj"][name] = q1.scale   # type: ignore[assignment]
        out["down_proj"][name] = q2.scale      # type: ignore[assignment]
    sgate = None
    if s.gate == "sigmoid":
        sgate = torch.randn(1, h, generator=gen, device="cuda", dtype=torch.bfloat16) / h ** 0.5
    return out, (q1, q2, sgate)


def load_block(block: MoeBlock, args: MoeArgs, scheme: str, gen: torch.Generator,
               scale_dtype: str = "fp32", shared_scheme: Optional[str] = None,
               rank: Optional[int] = None) -> dict[str, Any]:
    """Load every weight of the block in checkpoint format; returns what the reference needs (the
    whole layer's weights). `rank`: a rank of a multi-rank case, whose layer holds its shard only
    (backends/vllm/shards.py); every rank makes the whole layer's tensors from the same seed.

    An fp32 gate (GLM-4.5, MiniMax-M2) gets fp32 weights, as those checkpoints store it."""
    e, h = args.experts, args.hidden
    gate_dtype = torch.float32 if args.router.gate.dtype == "fp32" else torch.bfloat16
    gate_w = torch.randn(e.num, h, generator=gen, device="cuda", dtype=gate_dtype) / h ** 0.5
    gate_tensors = {"weight": gate_w}
    bias = None
    if args.router.bias:
        bias = 0.1 * torch.randn(e.num, generator=gen, device="cuda", dtype=torch.float32)
        gate_tensors["e_score_correction_bias"] = bias
    table = None
    if isinstance(args.router.select, HashSelect):
        table = hash_table(args.router.select.vocab, e.num, e.top_k, gen)
        gate_tensors["tid2eid"] = table
    load_params(block.gate, gate_tensors, "gate")
    re = cast(nn.Module, block.experts.routed_experts)    # FusedMoE's RoutedExperts (vLLM is untyped here)
    tensors, per_expert = expert_tensors(args, scheme, gen, scale_dtype)
    if scheme == "int4_w4a16":
        tensors = int4_marlin_tensors(per_expert, h, e.inter)
    expert_bias = None
    if e.bias:      # gpt-oss: bf16 biases after each expert GEMM (FusedMoE(has_bias=True))
        expert_bias = (0.1 * torch.randn(e.num, 2 * e.inter, generator=gen, device="cuda", dtype=torch.bfloat16),
                       0.1 * torch.randn(e.num, h, generator=gen, device="cuda", dtype=torch.bfloat16))
        tensors["w13_bias"], tensors["w2_bias"] = expert_bias
    params = dict(re.named_parameters(recurse=False))
    if rank is not None:                    # this rank's experts / intermediate slice of the whole layer
        tensors = shard_tensors(tensors, {k: tuple(p.shape) for k, p in params.items()}, rank)
    tensors = pad_to_params(tensors, params, interleaved_w13=bool(args.activation.interleaved))
    if bias is not None and "e_score_correction_bias" in dict(re.named_parameters(recurse=False)):
        # vLLM 0.26's routed experts register the gate's correction bias as their own parameter too
        tensors["e_score_correction_bias"] = bias
    load_params(re, tensors, "RoutedExperts")
    del tensors
    ref: dict[str, Any] = {"gate": gate_w, "bias": bias, "experts": per_expert, "shared": None, "hash_table": table,
                           "expert_bias": expert_bias}
    if block.shared is not None:
        sh, (q1, q2, sgate) = shared_tensors(args, shared_scheme or scheme, gen, scale_dtype)
        gate_up, down = sh["gate_up_proj"], sh["down_proj"]
        if rank is not None:                # merged gate/up rows halve by halve; down's columns
            gate_up = shard_tensors(gate_up, _shapes(block.shared.gate_up_proj), rank, lambda name: 0)
            down = shard_tensors(down, _shapes(block.shared.down_proj), rank, lambda name: None)
        load_params(block.shared.gate_up_proj, gate_up, "shared.gate_up_proj")
        load_params(block.shared.down_proj, down, "shared.down_proj")
        if sgate is not None:
            assert block.shared.expert_gate is not None
            load_params(block.shared.expert_gate, {"weight": sgate}, "shared_expert_gate")
        ref["shared"] = (q1, q2, sgate)
        ref["shared_scheme"] = shared_scheme or scheme
    return ref


def int4_marlin_tensors(per_expert: list[tuple[QuantMatrix, QuantMatrix]], hidden: int, inter: int
                        ) -> dict[str, torch.Tensor]:
    """compressed-tensors INT4 experts as `CompressedTensorsWNA16MarlinMoEMethod` holds them after its
    weight loader: each packed [N, K/8] and scale [N, K/32] transposed, the (N, K) shapes, and, with
    no activation ordering, the identity group index and sort order along K."""
    def stack(fn: Any) -> torch.Tensor:
        return torch.stack([fn(a, b) for a, b in per_expert])

    device = per_expert[0][0].q.device

    def along(k: int) -> torch.Tensor:
        return torch.arange(k, dtype=torch.int32, device=device).expand(len(per_expert), k).contiguous()

    def groups(k: int) -> torch.Tensor:
        return (along(k) // 32).to(torch.int32)

    n_experts = len(per_expert)
    return {
        "w13_weight_packed": stack(lambda a, b: a.q.T.contiguous()),
        "w2_weight_packed": stack(lambda a, b: b.q.T.contiguous()),
        "w13_weight_scale": stack(lambda a, b: a.scale.T.contiguous()),
        "w2_weight_scale": stack(lambda a, b: b.scale.T.contiguous()),
        "w13_weight_shape": torch.tensor([[2 * inter, hidden]] * n_experts, dtype=torch.float32, device=device),
        "w2_weight_shape": torch.tensor([[hidden, inter]] * n_experts, dtype=torch.float32, device=device),
        "w13_weight_g_idx": groups(hidden), "w2_weight_g_idx": groups(inter),
        "w13_g_idx_sort_indices": along(hidden), "w2_g_idx_sort_indices": along(inter),
    }


def _shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(p.shape) for k, p in module.named_parameters(recurse=False)}


def pad_to_params(tensors: dict[str, torch.Tensor], params: dict[str, nn.Parameter],
                  interleaved_w13: bool = False) -> dict[str, torch.Tensor]:
    """Zero-pad expert tensors into parameters that vLLM rounded up (MXFP4 on Marlin: intermediate to
    x128, hidden to x256; gpt-oss on triton_kernels: intermediate to x64), as its weight loader places
    them: each w13 half (gate rows, then up rows) at the top of its padded half; an interleaved w13
    (gpt-oss, whose loader copies into `param[:, :rows, :cols]`), w2 and the biases in the leading
    rows and columns. Zero fp4 codes read 0 whatever their (zero) scale."""
    out = dict(tensors)
    for name, t in tensors.items():
        p = params.get(name)
        if p is None or tuple(p.shape) == tuple(t.shape) or t.dim() != p.dim() or t.dim() not in (2, 3):
            continue
        if any(have > want for have, want in zip(t.shape, p.shape, strict=True)):
            continue                    # load_params names the mismatch
        padded = torch.zeros(tuple(p.shape), dtype=t.dtype, device=t.device)
        rest = tuple(slice(0, n) for n in t.shape[2:])
        if name.startswith("w13_") and not interleaved_w13:
            half, half_p = t.shape[1] // 2, p.shape[1] // 2
            padded[(slice(None), slice(0, half)) + rest] = t[:, :half]
            padded[(slice(None), slice(half_p, half_p + half)) + rest] = t[:, half:]
        else:
            padded[(slice(None), slice(0, t.shape[1])) + rest] = t
        out[name] = padded
    return out


def hash_table(vocab: int, experts: int, top_k: int, gen: torch.Generator, chunk_rows: int = 16384) -> torch.Tensor:
    """A synthetic tid2eid: for each token id, top_k distinct experts (int32, as DeepseekV4MoE keeps it)."""
    rows = []
    for start in range(0, vocab, chunk_rows):
        n = min(chunk_rows, vocab - start)
        noise = torch.rand(n, experts, generator=gen, device=gen.device)
        rows.append(noise.argsort(dim=1)[:, :top_k].to(torch.int32))
    return torch.cat(rows)


def process_after_loading(block: nn.Module) -> None:
    """What vLLM's loader does: process_weights_after_loading on every module with a quant method."""
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    for _, module in block.named_modules():
        qm = getattr(module, "quant_method", None)
        if isinstance(qm, QuantizeMethodBase):
            qm.process_weights_after_loading(module)
