"""The Model page: one serving scenario's step time from a run, layer by layer, two runs side by side.

Where the scenario comes from: a stored row keeps its op (type, args, sources), not the scenario
file's `count`, `step` or `metadata.scenario` (result.py `Row.to_json`), and a run times once an op
that decode and prefill share. So the page is given the facts `operatorx testlist serving` was given
(model, scheme, isl, osl, conc, tp, dp, ep, mtp, chunk: in the URL, one value for every run or one
per run) and writes the scenario again with the function that command calls (catalog/serving.py
`scenario_cases`; the same facts give the same cases), then times each step with `report/estimate.py`'s
`estimate` over the run's rows: one sum, the one `operatorx estimate` prints.

What it draws of each run, all from that estimate:
- one box per layer kind (attention, dense MLP, MoE, LM head, ...; `layer_kind` reads it from a
  role's module), each line one part of the estimate's by-role split, so the roles of one fused or
  merged GEMM case are one line ("self_attn.o_proj + mlp.down_proj"), with its time per step
  (Σ count × latency) and share of the step. A part whose roles are of several kinds sits in one box
  named by them all: its time is counted once. An op of the step with no ok row is its part's line
  "not measured (status: reason)", never a 0;
- a stacked bar per step by op class (the estimate's by_class); every run's bars on one axis.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Optional

from pydantic import ValidationError

from operatorx.report.estimate import Estimate, EstimateError, ScenarioFacts, estimate
from operatorx.web.safe import clean, clean_text
from operatorx.web.views import RunSummary, case_key

__all__ = ["ModelRequestError", "ScenarioAsk", "ScenarioRun", "PartCell", "PartLine", "LayerBox", "ModelRun",
           "ModelChoice", "ModelPage", "LAYER_KINDS", "FACT_FIELDS", "MAX_MODEL_RUNS", "layer_kind",
           "scenario_asks", "scenario_for", "model_run", "catalog_models", "facts_line", "page_steps"]

MAX_MODEL_RUNS = 4
"""Runs one Model page draws at most: each is a document read and a scenario written; more is a 400."""
MAX_FACT_DIGITS = 9
"""A scenario fact is a count of tokens, requests or GPUs: 9 digits is past any deployment, and a
longer number is a 400 before the catalog writes cases of it."""
LAYER_KINDS = ("attention", "linear attention", "dense MLP", "MoE", "hyper-connections", "LM head", "other")
"""The boxes, in the order a decoder layer runs them (the LM head once per step, last)."""
FACT_FIELDS = ("model", "scheme", "isl", "osl", "conc", "tp", "dp", "ep", "mtp", "chunk")
_DEFAULTS = {"tp": 1, "dp": 1, "ep": 1, "mtp": 0, "chunk": 8192}      # `testlist serving`'s defaults
_REQUIRED = ("model", "isl", "osl", "conc")
_SPLIT = re.compile(r"[.:]")


class ModelRequestError(ValueError):
    """A scenario the URL cannot give, in one line naming the parameter (the response is a 400)."""


def layer_kind(role: str) -> str:
    """The layer kind a role runs in, read from its module as vLLM names it (catalog/gemm_roles.py):
    `self_attn`/`attn` (with DeepSeek-V4's compressor and indexer) attention, `linear_attn` linear
    attention, `mlp`/`ffn` a MoE layer for its experts, router gate and shared experts, else a dense MLP
    (its `:all_reduce` too: serving.py writes that one after every dense MLP), `hc_*` hyper-connections,
    `lm_head` (and its logits' gather) the LM head."""
    module = _SPLIT.split(role, maxsplit=1)[0]
    rest = role[len(module) + 1:]
    if module in ("self_attn", "attn"):
        return "attention"
    if module == "linear_attn":
        return "linear attention"
    if module in ("mlp", "ffn"):
        moe = rest.startswith(("experts", "shared_expert")) or rest in ("gate", "shared_expert_gate")
        return "MoE" if moe else "dense MLP"
    if module.startswith("hc_"):
        return "hyper-connections"
    if module == "lm_head":
        return "LM head"
    return "other"


def _kinds(roles: list[str]) -> list[str]:
    found = {layer_kind(r) for r in roles}
    return [k for k in LAYER_KINDS if k in found]


# the scenario a URL asks for ----------------------------------------------------------------------
@dataclass(frozen=True)
class ScenarioAsk:
    """The flags of `testlist serving` as one run's URL gives them (scheme None: the checkpoint's first)."""

    model: str
    scheme: Optional[str]
    scenario: Any
    """catalog/serving.py's Scenario: the deployment's lengths, load and split."""


def _number(name: str, value: str) -> int:
    if not value.isascii() or not value.isdigit() or len(value) > MAX_FACT_DIGITS:
        raise ModelRequestError(f"{name} {value[:20]!r}: give a whole number of at most {MAX_FACT_DIGITS} digits")
    return int(value)


def scenario_asks(values: Callable[[str], list[str]], runs: int) -> Optional[list[ScenarioAsk]]:
    """Each run's scenario from the URL's parameters (`values(name)`: every value given for it, in
    order), or None when no fact is given (the page then asks for them). A fact given once holds for
    every run, given once per run it is that run's; an empty value is the default."""
    given = {name: values(name) for name in FACT_FIELDS}
    if not any(v.strip() for vs in given.values() for v in vs):
        return None
    out = []
    for i in range(runs):
        facts: dict[str, Any] = {}
        for name in FACT_FIELDS:
            vs = given[name]
            if len(vs) not in (0, 1, runs):
                raise ModelRequestError(f"{name}: {len(vs)} values for {runs} runs; give one for every run or "
                                        "one per run, in the runs' order")
            value = (vs[0] if len(vs) == 1 else vs[i] if vs else "").strip()
            if not value:
                if name in _REQUIRED:
                    raise ModelRequestError(f"{name}: missing{f' for run {i + 1}' if runs > 1 else ''}; the "
                                            "page needs the facts `operatorx testlist serving` was given")
                continue
            if len(value) > 200 or not value.isprintable():
                raise ModelRequestError(f"{name}: longer than any catalog name, or holds control characters")
            facts[name] = value if name in ("model", "scheme") else _number(name, value)
        from operatorx.catalog.serving import Scenario

        model, scheme = facts.pop("model"), facts.pop("scheme", None)
        out.append(ScenarioAsk(model, scheme, Scenario(**facts)))
    return out


@dataclass(frozen=True)
class ScenarioRun:
    """A scenario as `testlist serving` writes it: its facts (as the cases carry them), its cases and
    the parts the catalog could not produce."""

    facts: ScenarioFacts
    cases: list[Any]
    notes: list[str]
    layers: dict[str, int]
    """Decoder layers that run each layer kind (catalog/serving_layers.py)."""


def facts_line(facts: ScenarioFacts) -> str:
    """The scenario as the `testlist serving` flags that write it."""
    return (f"{facts.model} {facts.scheme}: --isl {facts.isl} --osl {facts.osl} --conc {facts.conc} --tp {facts.tp} "
            f"--dp {facts.dp} --ep {facts.ep} --mtp {facts.mtp} --chunk {facts.chunk}")


def scenario_for(ask: ScenarioAsk) -> ScenarioRun:
    """The cases `operatorx testlist serving` writes for `ask` (the catalog's `scenario_cases`, the
    same call that command makes); a model, scheme or split the catalog refuses is one line."""
    import warnings

    from operatorx.catalog.errors import CatalogError, CatalogWarning
    from operatorx.catalog.serving import pick_checkpoint, scenario_cases
    from operatorx.catalog.serving_layers import layer_counts

    sc = ask.scenario
    notes: list[str] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CatalogWarning)
            ckpt = pick_checkpoint(ask.model)
            scheme = ask.scheme or next(iter(ckpt.schemes))
            cases = scenario_cases(ckpt, scheme, sc, notes)
    except CatalogError as err:
        line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelRequestError(line if len(line) <= 300 else line[:300] + " …") from None
    layers: dict[str, int] = {}
    try:
        counts = layer_counts(ckpt.arch)
        layers = {"attention": counts.full_attention, "linear attention": counts.linear_attention,
                  "dense MLP": counts.dense_mlp, "MoE": counts.moe, "hyper-connections": counts.layers}
    except CatalogError:
        pass
    facts = ScenarioFacts(model=ckpt.id, scheme=scheme, **asdict(sc))
    return ScenarioRun(facts=facts, cases=cases, notes=list(dict.fromkeys(notes)),
                       layers={k: v for k, v in layers.items() if v})


# what the page draws ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PartCell:
    """One part of a step: its measured time and share, and its ops with no ok row."""

    time_us: Optional[float]
    """Σ count × latency of its measured ops; None when none of them is measured (never 0 for that)."""
    share: Optional[float]
    not_measured: list[str] = field(default_factory=list)
    """Per op of the part with no ok row: "not measured (status: reason), count N"."""
    inside: Optional[str] = None
    """The attention module whose case times this part in the step (its GEMM roles are inside it)."""


@dataclass(frozen=True)
class PartLine:
    name: str
    """Its roles, joined with " + " as the estimate's by-role split names a part."""
    cells: list[Optional[PartCell]]
    """Per step (the run's steps, in order); None where the step has no op of the part."""


@dataclass(frozen=True)
class LayerBox:
    kind: str
    """A layer kind, or several joined with " + " for parts whose roles span them."""
    layers: Optional[int]
    """Decoder layers that run it; None for the LM head (once per step) and a joined box."""
    lines: list[PartLine]
    time_us: list[float]
    """Per step: the sum of its lines' measured time."""
    notes: list[str] = field(default_factory=list)
    """The attention box: per step and module, whether the attention case or its GEMM roles are timed."""


@dataclass(frozen=True)
class ModelRun:
    run: RunSummary
    name: str
    """GPU (or device) · backend, with the run id where two runs of the page share that."""
    scenario: Optional[str] = None
    """`facts_line` of its scenario."""
    facts: Optional[ScenarioFacts] = None
    message: Optional[str] = None
    """One line, where nothing is drawn: no scenario asked, none of its ops in the run, rows estimate refuses."""
    estimate: Optional[Estimate] = None
    boxes: list[LayerBox] = field(default_factory=list)
    ops: int = 0
    """Distinct ops (one key) of the scenario over both steps: what a run of it times."""
    held: int = 0
    """Of those, the ones the run has a row for (any status)."""
    notes: list[str] = field(default_factory=list)
    """The parts of the model the catalog could not produce (`testlist serving`'s warnings)."""

    def to_json(self) -> dict[str, Any]:
        steps = []
        if self.estimate is not None:
            for s in self.estimate.steps:
                steps.append({**s.model_dump(mode="json"), "coverage": s.coverage_line()})
        est = None if self.estimate is None else {**self.estimate.model_dump(mode="json"), "steps": steps}
        return clean({"run": self.run.to_json(), "name": self.name, "scenario": self.scenario,
                      "facts": None if self.facts is None else self.facts.model_dump(mode="json"),
                      "message": self.message, "estimate": est, "boxes": [asdict(b) for b in self.boxes],
                      "ops": self.ops, "held": self.held, "notes": self.notes})  # type: ignore[no-any-return]


@dataclass(frozen=True)
class ModelChoice:
    """A catalog checkpoint and scheme whose cases a run's rows cite (`source_id`)."""

    model: str
    scheme: str


@dataclass(frozen=True)
class ModelPage:
    runs: list[ModelRun]
    asks: Optional[list[ScenarioAsk]]
    """The scenario of each run as the URL gave it; None: none given, the page asks for one."""
    choices: list[list[ModelChoice]]
    """Per run: the catalog checkpoints its rows cite (the form offers them)."""
    steps: list[str]
    classes: list[str]
    """Every op class of any run's steps, in the order the bars stack them."""

    def to_json(self) -> dict[str, Any]:
        return {"runs": [r.to_json() for r in self.runs], "steps": self.steps, "classes": self.classes,
                "asks": None if self.asks is None else [asdict(a) for a in self.asks],
                "choices": [[asdict(c) for c in cs] for cs in self.choices]}


def catalog_models(source_models: set[str]) -> list[ModelChoice]:
    """The catalog checkpoints and schemes whose cases cite one of `source_models` (the part of a
    source before its role): the scenarios a run of those rows may be a run of."""
    from operatorx.catalog.checkpoints import load_catalog

    out = []
    for ckpt in load_catalog():
        for scheme in ckpt.schemes:
            if ckpt.source_id(scheme) in source_models:
                out.append(ModelChoice(model=ckpt.id, scheme=scheme))
    return out


def _boxes(est: Estimate, layers: dict[str, int]) -> list[LayerBox]:
    """The layer boxes of an estimate (module docstring: the rule)."""
    n = len(est.steps)
    lines: dict[str, list[Optional[PartCell]]] = {}
    roles_of: dict[str, list[str]] = {}
    for i, step in enumerate(est.steps):
        for part in step.by_role:
            cells = lines.setdefault(part.name, [None] * n)
            roles_of.setdefault(part.name, part.name.split(" + "))
            cells[i] = PartCell(time_us=part.time_us, share=part.share)
        for u in step.unmeasured:
            name = " + ".join(u.roles)
            cells = lines.setdefault(name, [None] * n)
            roles_of.setdefault(name, list(u.roles))
            have = cells[i] or PartCell(time_us=None, share=None)
            why = f"not measured ({u.status}{': ' + clean_text(u.reason) if u.reason else ''}), count {u.count}"
            cells[i] = PartCell(time_us=have.time_us, share=have.share, not_measured=[*have.not_measured, why])
    for i, step in enumerate(est.steps):          # GEMM roles the step's attention case times
        used = {a.module for a in step.attention if a.used == "attention case"}
        for name, cells in lines.items():
            modules = {r.split(".", 1)[0] for r in roles_of[name] if "." in r}
            if cells[i] is None and modules and len(modules) == 1 and modules <= used and \
                    all("." in r for r in roles_of[name]):
                cells[i] = PartCell(time_us=None, share=None, inside=next(iter(modules)))
    boxes: dict[str, list[str]] = {}
    for name in lines:
        boxes.setdefault(" + ".join(_kinds(roles_of[name])), []).append(name)

    def order(kind: str) -> tuple[int, int]:
        parts = kind.split(" + ")
        return LAYER_KINDS.index(parts[0]), len(parts)

    out = []
    for kind in sorted(boxes, key=order):
        notes = []
        if kind == "attention":
            notes = [f"{s.step}: {a.module}: {a.used} timed ({a.why})" for s in est.steps for a in s.attention]
        box_lines = [PartLine(name=name, cells=lines[name]) for name in boxes[kind]]
        totals = [math.fsum(c.time_us for line in box_lines if (c := line.cells[i]) is not None and c.time_us)
                  for i in range(n)]
        out.append(LayerBox(kind=kind, layers=layers.get(kind), lines=box_lines, time_us=totals, notes=notes))
    return out


def model_run(run: RunSummary, name: str, doc_rows: list[dict[str, Any]], scenario: ScenarioRun) -> ModelRun:
    """One run's side of the page: the scenario's steps timed by `estimate` over the run's rows of
    the scenario's ops (other rows cannot change a sum over those keys, and are not read)."""
    from operatorx.result import Row

    keys = {c.key() for c in scenario.cases}
    rows, held = [], set()
    for r in doc_rows:
        op = r.get("op") or {}
        key = case_key(op)
        if key not in keys:
            continue
        held.add(key)
        m = r.get("metrics") or {}
        light = {**r, "metrics": {k: v for k, v in m.items() if k not in ("samples_us", "busy_samples_us")}} \
            if isinstance(m, dict) else r
        try:
            rows.append(Row.from_json(light))
        except (ValidationError, ValueError, KeyError, TypeError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            return ModelRun(run=run, name=name, scenario=facts_line(scenario.facts), facts=scenario.facts,
                            message=clean_text(f"run {run.id}: case {r.get('case_index')}: its row cannot be "
                                               f"read ({first[:200]})"), ops=len(keys), held=len(held),
                            notes=scenario.notes)
    base = ModelRun(run=run, name=name, scenario=facts_line(scenario.facts), facts=scenario.facts, ops=len(keys),
                    held=len(held), notes=scenario.notes)
    if not held:
        return replace(base, message=f"run {run.id} holds none of the {len(keys)} ops of this scenario: not a run "
                                        "of its testlist, or other facts wrote it")
    try:
        est = estimate(scenario.cases, rows, run=run.id, file=f"scenario {facts_line(scenario.facts)}")
    except EstimateError as err:
        return replace(base, message=clean_text(str(err)))
    return replace(base, estimate=est, boxes=_boxes(est, scenario.layers))


def page_steps(runs: list[ModelRun]) -> tuple[list[str], list[str]]:
    """(the steps of any run, in order; the op classes of any step, largest first over the runs)."""
    steps: list[str] = []
    time: dict[str, float] = {}
    for r in runs:
        for s in (r.estimate.steps if r.estimate else []):
            if s.step not in steps:
                steps.append(s.step)
            for c in s.by_class:
                time[c.name] = time.get(c.name, 0.0) + c.time_us
    return steps, sorted(time, key=lambda k: -time[k])

