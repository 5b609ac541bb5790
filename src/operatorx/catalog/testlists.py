"""The shipped testlists, rebuilt from the catalog; a test fails when a shipped file is stale.

- `gemm`: every checkpoint x scheme x deployed TP x M (decode 1..256, prefill 512..32768).
- `gemm_perf`: a short bf16 list for quick perf runs: one model per family shape class at
  its smallest deployed TP, a few decode and prefill M.
- `gemm_fp8`: the pinned FP8 cases (gemm_fp8_pinned.json: per-tensor, per-channel, DeepSeek
  block and ue8m0 cases whose args and order stay fixed), then every FP8 GEMM role of the
  checkpoints in GEMM_FP8 at their deployed TP over a few M.
- `moe_small`: one layer per MoE checkpoint scheme at tokens=1 (smallest deployed TP, plus
  each deployed TP where vLLM pads the experts' per-rank size, e.g. gpt-oss-120b's MXFP4
  experts at TP 2/4/8); one checkpoint per family swept over 8/64/512/2048 (the one MOE_SWEEP
  names, else the family's first data file); the checkpoints flagged `moe_routing_sweep` under
  every routing distribution.
- `attn_small`: the attention module of every checkpoint whose attention the catalog derives (its
  first scheme, smallest deployed TP, `parallel` where that TP is above 1): decode at 16 and 64
  requests over 8k context and an 8k-token prefill chunk over 8k (three cases a module, so one H200
  runs the list in minutes).

Rebuild with `python -m operatorx.catalog` (writes src/operatorx/testlists/).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from operatorx.catalog.attention_cases import attention_cases
from operatorx.catalog.checkpoints import load_catalog
from operatorx.catalog.errors import CatalogError, CatalogWarning
from operatorx.catalog.generate import generate, moe_cases
from operatorx.catalog.moe_layer import ROUTING_DISTRIBUTIONS, experts_inter
from operatorx.spec import Case, dump_testlist, merge_cases
from operatorx.spec.gemm import GemmArgs

__all__ = ["SHIPPED", "build_shipped", "write_shipped", "GEMM_PERF", "GEMM_FP8", "MOE_SWEEP"]

#: gemm_perf: (checkpoint id, TP, role, M values), bf16, ~20 cases: MLA, large/small GQA,
#: dense MLP and lm_head shapes over decode M 1..64 and prefill up to 32768.
GEMM_PERF = (
    ("deepseek-ai/DeepSeek-V3", 8, "self_attn.q_b_proj", (1, 64, 4096)),
    ("deepseek-ai/DeepSeek-V3", 8, "self_attn.o_proj", (1, 32768)),
    ("deepseek-ai/DeepSeek-V3", 8, "mlp.gate_up_proj", (16, 8192)),
    ("meta-llama/Llama-3.1-70B-Instruct", 4, "self_attn.qkv_proj", (1, 2048)),
    ("meta-llama/Llama-3.1-70B-Instruct", 4, "mlp.down_proj", (32, 32768)),
    ("meta-llama/Llama-3.1-8B-Instruct", 1, "mlp.gate_up_proj", (1, 4096, 16384)),
    ("Qwen/Qwen3-235B-A22B-Thinking-2507", 8, "self_attn.qkv_proj", (8, 1024)),
    ("Qwen/Qwen3-235B-A22B-Thinking-2507", 8, "lm_head", (64, 512)),
    ("openai/gpt-oss-120b", 4, "self_attn.qkv_proj", (2, 16384)),
)
SWEEP_TOKENS = (8, 64, 512, 2048)

#: moe_small's token sweep, by family, where the family's first data file is not the one to
#: sweep: quantized variants added later (Kimi-K2.5/K2.6, GLM-5.x, MiniMax-M2.5/M3 MXFP4) sort
#: before the checkpoint the family was first swept with, and the list's existing cases stay put.
MOE_SWEEP = {
    "kimi-k2": "moonshotai/Kimi-K2-Instruct",
    "glm-5": "zai-org/GLM-5",
    "minimax-m2": "MiniMaxAI/MiniMax-M2.5",
    "minimax-m3": "MiniMaxAI/MiniMax-M3-MXFP8",
}

#: gemm_fp8's catalog part: (checkpoint id, scheme name, M values); every role the scheme
#: runs in FP8 (router gate and lm_head stay bf16 and are left out) at each deployed TP.
GEMM_FP8 = (
    ("moonshotai/Kimi-K2-Instruct", "fp8_block", (1, 128, 4096)),
)


def _gemm() -> list[Case]:
    return generate()


def _gemm_perf() -> list[Case]:
    picked: list[Case] = []
    for model, tp, role, ms in GEMM_PERF:
        cases = [c for c in generate([model], [tp], ms) if c.sources[0].rsplit("/", 1)[-1] == role]
        if not cases:
            raise CatalogError(f"gemm_perf: {model} has no role {role} at tp={tp}")
        picked += [_as_bf16(c).with_sources([f"{model}/{role}"]) for c in cases]
    # Synthetic (no sources): the square GEMM that reads the card's bf16 matrix ceiling.
    picked.append(Case.model_validate({"type": "gemm", "sources": [], "args": {
        "m": 8192, "n": 8192, "k": 8192, "a": {"dtype": "bf16"}, "b": {"dtype": "bf16"}, "out": "bf16"}}))
    return merge_cases(picked)


def _as_bf16(case: Case) -> Case:
    """gemm_perf is bf16 only: an FP8 checkpoint's shape is kept, its operands set to bf16."""
    args = case.args_dict()
    args["a"] = args["b"] = {"dtype": "bf16"}
    return Case.model_validate({"type": "gemm", "args": args, "sources": case.sources})


def _gemm_fp8() -> list[Case]:
    text = (resources.files("operatorx.catalog") / "gemm_fp8_pinned.json").read_text()
    cases = [Case.model_validate(c) for c in json.loads(text)["cases"]]
    for model, scheme, ms in GEMM_FP8:
        made = [c for c in generate([model], None, ms, schemes=[scheme])
                if isinstance(c.args, GemmArgs) and c.args.b.dtype in ("e4m3", "e5m2")]
        if not made:
            raise CatalogError(f"gemm_fp8: {model} scheme {scheme} has no FP8 GEMM role")
        cases += made
    return merge_cases(cases)


def _sweep_picks() -> set[str]:
    """The checkpoint id swept over SWEEP_TOKENS in each MoE family."""
    moe = [c for c in load_catalog() if c.arch.is_moe]
    ids = {c.id for c in moe}
    families = sorted({c.family for c in moe})
    for family in MOE_SWEEP:        # a renamed or misspelt family would add a second pick, not replace the first
        if family not in families:
            raise CatalogError(f"MOE_SWEEP key '{family}' is no MoE checkpoint family of the catalog; "
                               f"the families are: {', '.join(families)}")
    unknown = sorted(i for i in MOE_SWEEP.values() if i not in ids)
    if unknown:
        raise CatalogError(f"MOE_SWEEP names checkpoints the catalog has no MoE data file for: {unknown}")
    family_of = {c.id: c.family for c in moe}
    for family, pick in MOE_SWEEP.items():
        if family_of[pick] != family:
            raise CatalogError(f"MOE_SWEEP key '{family}' names {pick}, a checkpoint of family '{family_of[pick]}'")
    picks: dict[str, str] = dict(MOE_SWEEP)
    for ckpt in moe:
        picks.setdefault(ckpt.family, ckpt.id)
    return set(picks.values())


def _moe_small() -> list[Case]:
    cases: list[Case] = []
    notes: list[str] = []
    swept = _sweep_picks()
    for ckpt in load_catalog():
        if not ckpt.arch.is_moe:
            continue
        tp = min(ckpt.tps)
        for name, roles in ckpt.schemes.items():
            src = ckpt.source_id(name)
            cases += moe_cases(ckpt.arch, roles, src, tp, (1,), False, notes)
            if ckpt.id in swept:
                cases += moe_cases(ckpt.arch, roles, src, tp, SWEEP_TOKENS, False, notes)
            for other in ckpt.tps:  # TPs where vLLM pads the experts' per-rank size: one case each
                run_inter, inter = experts_inter(ckpt.arch, roles["experts"], other)
                if other != tp and run_inter != inter:
                    cases += moe_cases(ckpt.arch, roles, src, other, (1,), False, notes)
            if ckpt.moe_routing_sweep:
                cases += moe_cases(ckpt.arch, roles, src, tp, (1,) + SWEEP_TOKENS, False, notes,
                                   distributions=ROUTING_DISTRIBUTIONS)
    for line in dict.fromkeys(notes):
        warnings.warn(line, CatalogWarning, stacklevel=2)
    return merge_cases(cases)


#: Three cases per module (catalog/attention_cases.py says why): one H200 runs the list in minutes.
ATTN_SMALL_DECODE = ((16, 8192), (64, 8192))
ATTN_SMALL_PREFILL = ((8192, 8192),)


def _attn_small() -> list[Case]:
    cases: list[Case] = []
    notes: list[str] = []
    for ckpt in load_catalog():
        if "attention" in ckpt.not_produced:      # its attention projections' scheme was not read
            continue
        name, roles = next(iter(ckpt.schemes.items()))
        cases += attention_cases(ckpt.arch, roles, ckpt.source_id(name), min(ckpt.tps), notes,
                                 ATTN_SMALL_DECODE, ATTN_SMALL_PREFILL)
    for line in dict.fromkeys(notes):
        warnings.warn(line, CatalogWarning, stacklevel=2)
    return merge_cases(cases)


SHIPPED: dict[str, Callable[[], list[Case]]] = {"gemm": _gemm, "gemm_perf": _gemm_perf, "gemm_fp8": _gemm_fp8,
                                                 "moe_small": _moe_small, "attn_small": _attn_small}


def build_shipped() -> dict[str, list[Case]]:
    """Every shipped testlist as the catalog generates it now (warnings silenced: they are data gaps
    the checkpoint files already document)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CatalogWarning)
        return {name: build() for name, build in SHIPPED.items()}


def write_shipped(directory: Path) -> dict[str, int]:
    """Write every shipped testlist into `directory`; returns case counts by name."""
    counts = {}
    for name, cases in build_shipped().items():
        dump_testlist(cases, directory / f"{name}.json")
        counts[name] = len(cases)
    return counts
