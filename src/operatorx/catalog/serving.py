"""A serving scenario → the ops of one decode step and one prefill chunk, each with its `count`.

`serving(model, Scenario(...))` reads one catalog checkpoint and writes, per step, every GEMM role
at the tokens one rank runs, each MoE layer, the attention module over its batch groups and the
collectives of the step; every case carries `count` (how many times the step runs it: layers x per
layer) and `step`. The rules (docs/serving.md says them in full and which ops are left out):

- Tokens per rank: decode runs conc/dp requests per dp rank, each with 1 + mtp tokens (the verified
  draft tokens); prefill runs one chunk of `chunk` tokens per dp rank (vLLM's max_num_batched_tokens,
  8192 by default), whole requests when isl fits in it, else one request's mean chunk.
- GEMMs are per rank at tp (gemm_roles; no `parallel`). lm_head runs once per step: in decode over
  every token (with MTP each draft position is verified), in prefill over one row per request of the
  chunk (vLLM computes logits at each scheduled request's last token).
- MoE layers and attention are whole layers with `parallel` {tp, dp, ep} ({tp, dp} for attention),
  their tokens / batch each dp group's; DeepSeek-V4's attention is one case per layer kind (compress
  ratio), counted over its own layers, in vLLM's default index-key cache (fp8).
- Collectives (bf16 hidden states): a tp all-reduce of tokens x hidden after the attention of every
  layer and after every dense MLP; lm_head's logits gathered over tp. A MoE layer's exchange is
  inside its case (the whole layer over its ranks), never a case of its own.
Identical ops (one key) within a step are one case, counts summed and sources joined.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Any, Literal, Optional

from pydantic import ValidationError

from operatorx.catalog.arch import Arch
from operatorx.catalog.checkpoints import Checkpoint, find_checkpoints
from operatorx.catalog.errors import CatalogError, CatalogWarning, MissingField, NotDerived
from operatorx.catalog.gemm_roles import ROLE_GROUPS, VOCAB_PADDING, GemmShape, gemm_shapes, mlp_prefix, split
from operatorx.catalog.moe_layer import experts_inter, moe_args
from operatorx.catalog.schemes import RoleSchemes, preset
from operatorx.catalog.serving_attention import attention_module, attention_modules, sliding_layers
from operatorx.catalog.serving_layers import LayerCounts, layer_counts
from operatorx.spec import Case

__all__ = ["Scenario", "DEFAULT_CHUNK", "serving", "scenario_cases", "pick_checkpoint"]

#: Prefill chunk tokens per dp rank when none is given: vLLM's max_num_batched_tokens default for
#: its OpenAI server on a large-memory GPU.
DEFAULT_CHUNK = 8192

StepName = Literal["decode", "prefill"]


@dataclass(frozen=True)
class Scenario:
    """One deployment under load: input/output lengths, concurrent requests, the split, MTP depth."""

    isl: int
    osl: int
    conc: int
    tp: int = 1
    dp: int = 1
    ep: int = 1
    mtp: int = 0
    chunk: int = DEFAULT_CHUNK

    @property
    def world(self) -> int:
        return self.tp * self.dp

    @property
    def requests_per_rank(self) -> int:
        """Decode requests one dp rank holds: conc / dp."""
        return self.conc // self.dp

    def check(self) -> None:
        """One CatalogError line naming the first bad flag."""
        for name in ("isl", "osl", "conc", "tp", "dp", "ep", "chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CatalogError(f"--{name} must be a positive integer; got {value!r}")
        if isinstance(self.mtp, bool) or not isinstance(self.mtp, int) or self.mtp < 0:
            raise CatalogError(f"--mtp must be a non-negative integer; got {self.mtp!r}")
        if self.conc % self.dp:
            raise CatalogError(f"--dp {self.dp} does not divide --conc {self.conc} "
                               "(each dp rank holds conc/dp requests)")
        if self.ep not in (1, self.world):
            raise CatalogError(f"--ep {self.ep}: expert parallelism spans every rank or none, so ep is 1 or "
                               f"tp·dp = {self.world}")

    def decode_batch(self) -> dict[str, Any]:
        """conc/dp requests of 1 + mtp new tokens over isl + osl/2 cached ones (mid-way through the output)."""
        return {"groups": [{"count": self.requests_per_rank, "q": 1 + self.mtp, "ctx": self.isl + self.osl // 2}]}

    def prefill_batch(self) -> dict[str, Any]:
        """One chunk of a dp rank. isl <= chunk: chunk // isl whole requests (at most conc/dp) from ctx 0,
        plus the first `rest` tokens of one more request when the budget has room. isl > chunk: one
        request's mean chunk, `chunk` tokens over chunk·(n-1)//2 cached ones (n = its chunks)."""
        if self.isl > self.chunk:
            chunks = -(-self.isl // self.chunk)
            return {"groups": [{"count": 1, "q": self.chunk, "ctx": self.chunk * (chunks - 1) // 2}]}
        whole = min(self.chunk // self.isl, self.requests_per_rank)
        groups: list[dict[str, Any]] = [{"count": whole, "q": self.isl, "ctx": 0}]
        rest = self.chunk - whole * self.isl
        if rest and whole < self.requests_per_rank:
            groups.append({"count": 1, "q": rest, "ctx": 0})
        return {"groups": groups}


def _tokens(batch: dict[str, Any]) -> int:
    return sum(g["count"] * g["q"] for g in batch["groups"])


def _requests(batch: dict[str, Any]) -> int:
    return sum(g["count"] for g in batch["groups"])


class _Step:
    """The cases of one step as they are made: merged by key, counts summed, sources joined in order."""

    def __init__(self, step: StepName, source_id: str, metadata: dict[str, Any]) -> None:
        self.step, self.source_id, self.metadata = step, source_id, metadata
        self.cases: dict[str, Case] = {}

    def add(self, kind: str, args: dict[str, Any], role: str, count: int,
            per_rank: Optional[dict[str, Any]] = None, extra: Optional[dict[str, str]] = None) -> None:
        """One op run `count` times by the step (none when 0), merged into a case of the same key;
        `extra` is metadata of this op (facts its case format cannot hold)."""
        if count < 1:
            return
        source = f"{self.source_id}/{role}"
        meta = {**self.metadata, **({"deployment": per_rank} if per_rank else {}), **(extra or {})}
        try:
            case = Case.model_validate({"type": kind, "args": args, "sources": [source], "count": count,
                                        "step": self.step, "metadata": meta})
        except ValidationError as err:
            first = err.errors()[0]
            raise CatalogError(f"{source} ({self.step}): case not produced: {'.'.join(map(str, first['loc']))}: "
                               f"{first['msg']}") from None
        have = self.cases.get(case.key())
        if have is None:
            self.cases[case.key()] = case
            return
        sources = list(dict.fromkeys([*have.sources, source]))
        self.cases[case.key()] = have.model_copy(update={"count": (have.count or 0) + count, "sources": sources})


def _gemm_count(group: str, shape: GemmShape, arch: Arch, layers: LayerCounts, tp: int) -> int:
    """How many times one step runs a per-rank GEMM role (its layers; lm_head and hc_head_fn once)."""
    role = shape.role
    if group == "attention":
        if role.startswith("linear_attn."):
            return layers.linear_attention
        if role == "attn.wo_a":                      # one case is one group's GEMM: o_groups/tp per rank
            return layers.layers * split(arch.int("o_groups", "attn.wo_a"), tp, "o_groups", arch.origin)
        return layers.full_attention if role.startswith("self_attn.") else layers.layers
    if group == "compressor_indexer":
        if ":c" in role:
            return layers.at_ratio(int(role.rsplit(":c", 1)[1]))
        return layers.at_ratio(4)                    # the indexer runs in the ratio-4 layers
    if group == "hyper_connections":
        return 1 if role == "hc_head_fn" else layers.layers
    if group == "dense_mlp":
        return layers.dense_mlp
    if group == "moe_side":
        return layers.moe
    return 1                                         # lm_head


def _gemms(step: _Step, arch: Arch, schemes: RoleSchemes, ckpt: Checkpoint, sc: Scenario, tokens: int,
           logit_rows: int, layers: LayerCounts, notes: list[str]) -> None:
    """Every per-rank GEMM role; lm_head over `logit_rows` rows (decode: every token, each verified
    draft position has its logits; prefill: each request's last scheduled token)."""
    deployment = {"tp": [sc.tp], **({"dp": [sc.dp]} if sc.dp > 1 else {})}
    for group in ROLE_GROUPS:
        if group in ckpt.not_produced:
            continue
        others = tuple(g for g in ROLE_GROUPS if g != group)
        for shape in gemm_shapes(arch, sc.tp, False, notes, others):
            scheme = preset(shape.preset, shape.role) if shape.preset else schemes[shape.scheme_role]
            args: dict[str, Any] = {"m": logit_rows if group == "lm_head" else tokens, "n": shape.n, "k": shape.k,
                                    "a": scheme.a, "b": scheme.b,
                                    "out": "fp32" if scheme.a.get("dtype") == "fp32" else shape.out}
            if shape.bias:
                args["bias"] = True
            step.add("gemm", args, shape.role, _gemm_count(group, shape, arch, layers, sc.tp), deployment)


def _moe(step: _Step, arch: Arch, schemes: RoleSchemes, sc: Scenario, tokens: int, layers: LayerCounts) -> None:
    if not arch.is_moe or layers.moe == 0:
        return
    if sc.ep > 1:
        split(arch.int("num_experts", "expert parallelism"), sc.ep, "num_experts (over ep)", arch.origin)
    else:                                            # vLLM splits each expert over the flattened tp·dp group
        experts_inter(arch, schemes["experts"], sc.world)
    parallel = {k: v for k, v in (("tp", sc.tp), ("dp", sc.dp), ("ep", sc.ep)) if v > 1}
    prefix = mlp_prefix(arch)
    for hashed, count in ((False, layers.moe - layers.hash_moe), (True, layers.hash_moe)):
        if count < 1:
            continue
        args = moe_args(arch, schemes["experts"], schemes["shared_experts"], 1, tokens, hash_routed=hashed)
        if arch.opt("shared_expert_intermediate_size") or arch.opt("n_shared_experts"):
            moe_args(arch, schemes["experts"], schemes["shared_experts"], sc.tp, tokens)   # shared split over tp
        if parallel:
            args["parallel"] = parallel
        step.add("moe", args, f"{prefix}.experts:hash" if hashed else f"{prefix}.experts", count)


def _attention(step: _Step, arch: Arch, schemes: RoleSchemes, sc: Scenario, batch: dict[str, Any],
               layers: LayerCounts, notes: list[str]) -> None:
    try:
        made = attention_modules(arch, schemes, batch, sc.tp, sc.dp)
    except (MissingField, NotDerived) as err:
        notes.append(f"{arch.origin}: attention not produced: {err}")
        return
    sliding = sliding_layers(arch)
    for m in made:
        count = (m.layers if m.layers is not None else layers.linear_attention if m.kind == "gdn"
                 else sliding if m.role.endswith(":sliding") else layers.full_attention - sliding)
        step.add(m.kind, m.args, m.role, count, extra=m.metadata)


def _collective(step: _Step, kind: str, elements: int, world: int, role: str, count: int) -> None:
    if world < 2:
        return
    step.add("collective", {"kind": kind, "elements": elements, "dtype": "bf16", "parallel": {"tp": world}},
             role, count)


def _collectives(step: _Step, arch: Arch, sc: Scenario, tokens: int, logit_rows: int, layers: LayerCounts) -> None:
    hidden = arch.int("hidden_size", "the collectives of a step")
    per_rank = tokens * hidden
    prefix = mlp_prefix(arch)
    attention = attention_module(arch)
    _collective(step, "all_reduce", per_rank, sc.tp, f"{attention}:all_reduce", layers.full_attention)
    _collective(step, "all_reduce", per_rank, sc.tp, "linear_attn:all_reduce", layers.linear_attention)
    _collective(step, "all_reduce", per_rank, sc.tp, f"{prefix}:all_reduce", layers.dense_mlp)
    # no MoE collective: the MoE case is the whole layer over its ranks (`parallel`), its all-reduce or
    # dispatch/combine inside it, and a step that also counted them would count them twice
    vocab = -(-arch.int("vocab_size", "lm_head's logits") // VOCAB_PADDING) * VOCAB_PADDING
    _collective(step, "all_gather", logit_rows * vocab, sc.tp, "lm_head:all_gather", 1)


def scenario_cases(ckpt: Checkpoint, scheme: str, sc: Scenario, notes: list[str],
                   arch: Optional[Arch] = None) -> list[Case]:
    """The decode step's cases, then the prefill chunk's, of `ckpt` in `scheme` under `sc`. `arch`
    replaces the checkpoint's facts (a test adds one the catalog lacks); skipped parts go to `notes`."""
    sc.check()
    arch = arch or ckpt.arch
    if scheme not in ckpt.schemes:
        raise CatalogError(f"--scheme {scheme}: {ckpt.id} ships {', '.join(ckpt.schemes)}")
    schemes = ckpt.schemes[scheme]
    source_id = ckpt.source_id(scheme)
    layers = layer_counts(arch)
    meta = {"scenario": {"model": ckpt.id, "scheme": scheme, **asdict(sc)}}
    out: list[Case] = []
    for name, batch in (("decode", sc.decode_batch()), ("prefill", sc.prefill_batch())):
        step = _Step(name, source_id, meta)  # type: ignore[arg-type]
        tokens = _tokens(batch)
        logit_rows = tokens if name == "decode" else _requests(batch)   # lm_head's rows (_gemms says why)
        _gemms(step, arch, schemes, ckpt, sc, tokens, logit_rows, layers, notes)
        try:
            _moe(step, arch, schemes, sc, tokens, layers)
        except MissingField as err:
            notes.append(f"{arch.origin}: MoE layer ({name}) not produced: {err}")
        _attention(step, arch, schemes, sc, batch, layers, notes)
        _collectives(step, arch, sc, tokens, logit_rows, layers)
        out += step.cases.values()
    return out


def pick_checkpoint(model: str) -> Checkpoint:
    """Exactly one catalog checkpoint by id or name after the org (a family naming several is an error)."""
    hits = find_checkpoints([model])
    if len(hits) > 1:
        raise CatalogError(f"--model {model} names {len(hits)} checkpoints ({', '.join(c.id for c in hits)}); "
                           "give one id")
    return hits[0]


def serving(model: str, sc: Scenario, scheme: Optional[str] = None) -> list[Case]:
    """The scenario cases of one catalog checkpoint (`scheme`: default its first); skipped parts are
    CatalogWarnings naming the missing fact."""
    ckpt = pick_checkpoint(model)
    notes: list[str] = []
    cases = scenario_cases(ckpt, scheme or next(iter(ckpt.schemes)), sc, notes)
    for line in dict.fromkeys(notes):
        warnings.warn(line, CatalogWarning, stacklevel=2)
    return cases
