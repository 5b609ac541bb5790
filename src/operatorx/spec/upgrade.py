"""`operatorx testlist upgrade`: the older flat testlist formats → the descriptor format.

Upstream's `moe_layer` type and `quant` slot spelling load as they are (spec/spelling.py); the
upgrade writes them in today's spelling too.

Two older forms exist upstream:
- gemm with dtype strings: `{"type": "gemm", "name": "...", "args": {"m", "n", "k", "dtype_a",
  "dtype_b", "dtype_out", "bias"?, "activation"?}}`;
- MoE as `{"type": "moe_gemm", "name": "...", "args": {"num_tokens", "hidden", "intermediate",
  "num_experts", "top_k", "dtype_act", "dtype_weight", "expert_parallel_size",
  "routed_tensor_parallel_size", "shared_tensor_parallel_size", "n_shared_experts",
  "expert_distribution"}}`, sizes global, the parallel sizes beside them.

What they meant, and so what each becomes:
- dtype strings name a scheme: `bf16`/`fp16`/`fp32` a float operand; `nvfp4` and `mxfp4` their
  standard block scales; `fp8` in a gemm a per-tensor FP8 GEMM (one static fp32 scale per operand,
  as the old backends ran torch._scaled_mm), in an MoE DeepSeek block FP8 (1x128 dynamic
  activation scales, 128x128 weight blocks), the only FP8 MoE the old backends ran.
- the sizes are the whole layer's, and so are ours; the split goes into `parallel` in upstream's
  meaning (docs/case-format.md): TP within the experts is `tp`; expert parallelism over E ranks
  with whole experts per rank is `{tp: E, ep: E}` (every rank sees the batch, as vLLM runs
  TP attention with EP experts; how an EP layer splits its shared experts is the backend's choice
  there, so the old shared-expert TP is dropped). The old format's other grids (EP across TP
  groups, a shared-expert TP other than the routed one without EP) have no upstream equivalent
  and are refused by field.
- the old MoE format has no router and (unless `hidden_act` is given) no activation: the upgrade
  writes a bf16 softmax top-k router (renormalized) and SiLU, and says so in a note per file.
- `expert_distribution`: uniform → natural (random router inputs), zipf → zipf s=1,
  single_hot/balanced as named.
- the old `name` (a case title) becomes the case's one source.
Anything else has no equivalent: UpgradeError names the case and the field.
"""

from __future__ import annotations

from typing import Any, Optional

from operatorx.spec.spelling import todays_spelling
from operatorx.spec.testlist import TestlistError, old_format, parse_cases

__all__ = ["UpgradeError", "upgrade_cases", "upgrade_case"]

_F32_TENSOR_STATIC = {"dtype": "fp32", "static": True, "group": [-1, -1]}
_FLOATS = ("bf16", "fp16", "fp32")
_OUTS = ("bf16", "fp16", "fp32")


class UpgradeError(ValueError):
    """One line per old case field that has no equivalent in the descriptor format."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def _scale(dtype: str, static: bool, group: list[int]) -> dict[str, Any]:
    return {"dtype": dtype, "static": static, "group": group}


def _operand(name: str, *, weight: bool, moe: bool) -> Optional[dict[str, Any]]:
    """The descriptor an old dtype string stands for; None when it has none."""
    if name in _FLOATS:
        return {"dtype": name}
    if name == "fp8" and not moe:
        return {"dtype": "e4m3", "scale": dict(_F32_TENSOR_STATIC)}
    if name == "fp8":
        group = [128, 128] if weight else [1, 128]
        return {"dtype": "e4m3", "scale": _scale("fp32", weight, group)}
    if name == "mxfp4":
        return {"dtype": "e2m1", "scale": _scale("ue8m0", weight, [1, 32])}
    if name == "nvfp4":
        return {"dtype": "e2m1", "scale": _scale("e4m3", weight, [1, 16]), "scale2": dict(_F32_TENSOR_STATIC)}
    return None


class _Case:
    """One old case being read: collects problems that name its index and field."""

    def __init__(self, origin: str, index: int, item: dict[str, Any]):
        self.where = f"{origin}: case {index}"
        self.item = item
        self.args: dict[str, Any] = dict(item.get("args") or {})
        self.problems: list[str] = []

    def fail(self, field: str, why: str) -> None:
        self.problems.append(f"{self.where}: args.{field}: {why}")

    def integer(self, field: str, default: Optional[int] = None, minimum: int = 1) -> int:
        value = self.args.pop(field, default)
        if value is None:
            self.fail(field, "missing; the old format requires it")
            return minimum
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(field, f"{value!r} is not an integer >= {minimum}")
            return minimum
        return value

    def operand(self, field: str, *, weight: bool, moe: bool, default: Optional[str] = None) -> dict[str, Any]:
        name = self.args.pop(field, default)
        op = _operand(name, weight=weight, moe=moe) if isinstance(name, str) else None
        if op is None:
            known = ", ".join((*_FLOATS, "fp8", "nvfp4", "mxfp4"))
            self.fail(field, f"{name!r} has no descriptor equivalent (known: {known}); write the operand "
                             "descriptor by hand (docs/case-format.md)")
            return {"dtype": "bf16"}
        return op

    def per_rank(self, field: str, total: int, parts: int, parts_field: str) -> int:
        if total % parts:
            self.fail(field, f"{total} does not divide by {parts_field}={parts}; no per-rank shape")
            return 1
        return total // parts

    def leftovers(self) -> None:
        if self.args.get("world_size") == 1:       # one rank: nothing to record
            del self.args["world_size"]
        elif "world_size" in self.args:
            self.fail("world_size", f"{self.args.pop('world_size')!r}: a multi-rank case has no equivalent yet "
                                    "here (the old world_size is not upstream's tp·dp); write `parallel`")
        for key in self.args:
            self.fail(key, "has no equivalent in the descriptor format; remove it or write the case by hand")

    def meta(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        name = self.item.get("name")
        if isinstance(name, str) and name.strip():
            out["sources"] = [name]
        elif name is not None:
            out["name"] = name
        for key, value in self.item.items():
            if key not in ("type", "args", "name"):
                out[key] = value
        return out


def _gemm(c: _Case) -> dict[str, Any]:
    m, n, k = c.integer("m"), c.integer("n"), c.integer("k")
    a = c.operand("dtype_a", weight=False, moe=False)
    b = c.operand("dtype_b", weight=True, moe=False, default=None)
    out = c.args.pop("dtype_out", "bf16")
    if out not in _OUTS:
        c.fail("dtype_out", f"{out!r}: outputs are {', '.join(_OUTS)}")
    args: dict[str, Any] = {"m": m, "n": n, "k": k, "a": a, "b": b, "out": out}
    for key in ("bias", "activation"):
        value = c.args.pop(key, None)
        if value not in (None, False):
            args[key] = value
    c.leftovers()
    return {"type": "gemm", "args": args, **c.meta()}


_DISTRIBUTIONS: dict[str, Any] = {"uniform": "natural", "natural": "natural", "balanced": "balanced",
                                  "single_hot": "single_hot", "zipf": {"kind": "zipf", "s": 1.0}}


def _moe(c: _Case) -> dict[str, Any]:
    tokens, hidden, inter = c.integer("num_tokens"), c.integer("hidden"), c.integer("intermediate")
    num, top_k = c.integer("num_experts"), c.integer("top_k")
    ep = c.integer("expert_parallel_size", 1)
    routed_tp = c.integer("routed_tensor_parallel_size", 1)
    shared_tp = c.integer("shared_tensor_parallel_size", 1)
    n_shared = c.integer("n_shared_experts", 0, minimum=0)
    a1 = c.operand("dtype_act", weight=False, moe=True)
    w = c.operand("dtype_weight", weight=True, moe=True)
    dist_name = c.args.pop("expert_distribution", "uniform")
    distribution = _DISTRIBUTIONS.get(dist_name) if isinstance(dist_name, str) else None
    if distribution is None:
        c.fail("expert_distribution", f"{dist_name!r} has no equivalent (known: {', '.join(_DISTRIBUTIONS)})")
        distribution = "natural"
    c.per_rank("num_experts", num, ep, "expert_parallel_size")
    c.per_rank("intermediate", inter, routed_tp, "routed_tensor_parallel_size")
    if ep > 1 and routed_tp > 1:
        c.fail("routed_tensor_parallel_size", f"{routed_tp} with expert_parallel_size={ep}: upstream's split "
                                              "has no TP inside expert-parallel groups (ep is 1 or tp·dp)")
    if n_shared and ep == 1 and shared_tp != routed_tp:
        c.fail("shared_tensor_parallel_size", f"{shared_tp}: the shared experts split like the layer "
                                              f"({routed_tp} ways) in upstream's split")
    experts: dict[str, Any] = {"num": num, "top_k": top_k, "inter": inter, "a1": a1, "w1": w, "w2": w, "a2": a1}
    args: dict[str, Any] = {
        "tokens": tokens, "hidden": hidden, "out": "bf16", "experts": experts,
        "router": {"gate": {"dtype": "bf16"}, "scoring": "softmax", "select": {"kind": "topk"},
                   "renormalize": True},
        "activation": {"kind": c.args.pop("hidden_act", "silu")},
        "routing": {"distribution": distribution, "seed": 0},
    }
    if n_shared:
        args["shared"] = {"count": n_shared, "a1": a1, "w1": w, "w2": w, "inter": inter}
    if ep > 1:
        args["parallel"] = {"tp": ep, "ep": ep}
    elif routed_tp > 1:
        args["parallel"] = {"tp": routed_tp}
    c.leftovers()
    return {"type": "moe", "args": args, **c.meta()}


def upgrade_case(item: Any, origin: str, index: int) -> tuple[Any, bool]:
    """(the case in the descriptor format, whether it was old); UpgradeError if it cannot be."""
    kind = old_format(item)
    if kind is None:
        spelled = todays_spelling(item) if isinstance(item, dict) else item
        return spelled, spelled is not item
    c = _Case(origin, index, item)
    if not isinstance(item.get("args"), dict):
        raise UpgradeError([f"{c.where}: args: an object is required"])
    new = _moe(c) if kind == "moe_gemm" else _gemm(c)
    if c.problems:
        raise UpgradeError(c.problems)
    return new, True


def upgrade_cases(data: Any, origin: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(upgraded cases as JSON data, notes for the user); UpgradeError lists every problem.

    Cases already in the descriptor format pass through. The result is validated as a testlist,
    so a converted case the format refuses (e.g. a block scale that does not divide hidden) is an
    error naming the new field.
    """
    if not isinstance(data, list):
        raise UpgradeError([f"{origin}: a testlist is a JSON array of cases, got {type(data).__name__}"])
    out: list[dict[str, Any]] = []
    problems: list[str] = []
    moe_count = gemm_count = respelled = 0
    for index, item in enumerate(data):
        try:
            new, was_old = upgrade_case(item, origin, index)
        except UpgradeError as err:
            problems += err.problems
            continue
        if was_old and old_format(item) is None:
            respelled += 1
        elif was_old:
            moe_count += new["type"] == "moe"
            gemm_count += new["type"] == "gemm"
        out.append(new)
    if problems:
        raise UpgradeError(problems)
    try:
        parse_cases(out, f"{origin} (upgraded)", on_warning=lambda _msg: None)
    except TestlistError as err:
        raise UpgradeError(err.all_problems) from err
    notes = [f"{gemm_count} gemm and {moe_count} moe cases converted, {len(out) - gemm_count - moe_count - respelled} "
             "already in the descriptor format"]
    if respelled:
        notes.append(f"{respelled} cases in upstream's moe_layer / `quant` spelling written as `moe` with a1/w1/w2/a2")
    if moe_count:
        notes.append("the old MoE format names no router or activation: written as a bf16 softmax top-k router "
                     "(renormalized) and SiLU; edit them where the model differs")
    return out, notes
