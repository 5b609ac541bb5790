"""A serving step's time from a run: Σ count × latency_us over a scenario file's ops (docs/serving.md).

`estimate(cases, rows)` reads the entries of a `testlist serving` file (each with `count` and `step`)
and the rows of a run, matched by case key. Per step:

- step time = Σ count × latency_us over the entries whose row is `ok`; every other entry is listed as
  not measured with its row's status and reason (or `not in run`) and its count, never summed as 0.
- Attention overlaps GEMMs: an attention case times its whole module, projections included, which the
  GEMM roles `<module>.*` (`self_attn.q_proj`, `linear_attn.out_proj`) time too. Per module, the
  attention case's time is used where its row is ok, else the module's GEMM roles; never both.
  A GEMM case merged over roles of several modules (one key) keeps the part of its count that is
  not the replaced module's: each replaced role runs once per layer of its module, which is the
  attention case's count (catalog/serving.py writes it so). A module with several layer kinds has one
  attention case per kind (`self_attn:sliding`, DeepSeek-V4's `attn:c4`): each ok one replaces its own
  layers' part of the module's GEMM roles, and the layers of a kind without an ok row keep theirs.
- Tokens per step per dp rank come from the file's `metadata.scenario` through the same rule that wrote
  the file (Scenario.decode_batch/prefill_batch): decode conc/dp × (1 + mtp) (the verified tokens, an
  upper bound on the accepted ones), prefill the chunk's tokens. The tp GPUs of a dp rank share them,
  so tokens/s per GPU = tokens per dp rank / tp / step time.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Literal, Optional

from pydantic import BaseModel, ValidationError

from operatorx.result import Row
from operatorx.spec import Case

__all__ = ["NOT_IN_SCENARIO", "EstimateError", "Estimate", "StepEstimate", "Share", "Unmeasured", "AttentionChoice",
           "StepTokens", "ScenarioFacts", "estimate", "role_of"]

UnmeasuredStatus = Literal["unsupported", "error", "missing", "not in run"]

#: What a served step runs that no op of a scenario file times (no op type for it here), so a step
#: time read against an engine's knows what it leaves out.
NOT_IN_SCENARIO: tuple[str, ...] = (
    "each layer's input and post-attention RMSNorm and residual adds",
    "the embedding lookup and the final norm",
    "logits processing and sampling",
    "the engine's host work between steps (scheduling, input preparation)",
)


class EstimateError(ValueError):
    """Bad input for an estimate: one line naming the file, the case and the field."""


class ScenarioFacts(BaseModel):
    """The deployment a scenario file was written for (its cases' `metadata.scenario`)."""

    model: str
    scheme: str
    isl: int
    osl: int
    conc: int
    tp: int
    dp: int
    ep: int
    mtp: int
    chunk: int


class Share(BaseModel):
    """One part of a step (an op class or a layer role): its time and its fraction of the step."""

    name: str
    time_us: float
    share: float


class Unmeasured(BaseModel):
    """A scenario entry with no ok row: left out of the step time, with why."""

    label: str
    op_class: str
    roles: list[str]
    count: int
    status: UnmeasuredStatus
    reason: Optional[str] = None


class AttentionChoice(BaseModel):
    """Which timing an attention module's projections come from in a step, and why."""

    module: str
    used: Literal["attention case", "gemm roles"]
    why: str


class StepTokens(BaseModel):
    """Tokens one dp rank runs in the step and what that gives per GPU (module docstring says the rule)."""

    tokens_per_dp_rank: int
    gpus_per_dp_rank: int
    tokens_per_s_per_gpu: Optional[float]
    """None when some op of the step has no ok row, or nothing was measured: a rate over part of a
    step would read faster than the step runs."""
    rule: str


class StepEstimate(BaseModel):
    step: str
    time_us: float
    ops: int
    """Entries of the step in the file."""
    ops_measured: int
    """Entries whose time is in `time_us`: an ok row used, or inside an attention case used."""
    ops_in_attention: int
    """Of `ops_measured`, the GEMM-role entries whose time is the attention case's."""
    counts: int
    counts_measured: int
    by_class: list[Share]
    by_role: list[Share]
    attention: list[AttentionChoice]
    unmeasured: list[Unmeasured]
    tokens: Optional[StepTokens]
    not_in_scenario: list[str] = list(NOT_IN_SCENARIO)
    """What the step runs in a server that the scenario has no op for (NOT_IN_SCENARIO)."""

    @property
    def counts_fraction(self) -> float:
        return self.counts_measured / self.counts if self.counts else 0.0

    def coverage_line(self) -> str:
        inside = f" ({self.ops_in_attention} inside an attention case)" if self.ops_in_attention else ""
        return (f"{self.ops_measured} of {self.ops} ops measured{inside}, "
                f"{100 * self.counts_fraction:.1f}% of counts")


class Estimate(BaseModel):
    run: str
    scenario_file: str
    scenario: Optional[ScenarioFacts]
    steps: list[StepEstimate]


def role_of(source: str) -> str:
    """The layer role of a `<checkpoint>/<role>` source (a checkpoint id holds one slash, a role none)."""
    return source.rsplit("/", 1)[-1]


def _roles(case: Case) -> list[str]:
    return list(dict.fromkeys(role_of(s) for s in case.sources)) or ["(no source)"]


def _index(rows: list[Row], run: str) -> dict[str, Row]:
    """Rows by case key; rank-local shards are not a whole case and are left out. Two rows of one case
    (an A/B run, two backends) leave the estimate ambiguous: refused."""
    out: dict[str, Row] = {}
    for r in rows:
        if r.rank_local is not None:
            continue
        key = r.case.key()
        have = out.get(key)
        if have is not None:
            sides = ", ".join(f"{x.backend}{' ' + x.side if x.side else ''}" for x in (have, r))
            raise EstimateError(f"run {run}: case {r.label()} has several rows ({sides}); estimate reads a run "
                                "of one backend and side")
        out[key] = r
    return out


def _scenario(cases: list[Case], file: str) -> Optional[ScenarioFacts]:
    """The file's one scenario (None when no case carries one); two different ones are refused."""
    found: Optional[ScenarioFacts] = None
    for i, c in enumerate(cases):
        raw = c.metadata.get("scenario")
        if raw is None:
            continue
        try:
            facts = ScenarioFacts.model_validate(raw)
        except ValidationError as err:
            first = err.errors()[0]
            raise EstimateError(f"{file}: case {i}: metadata.scenario.{'.'.join(map(str, first['loc']))}: "
                                f"{first['msg']}") from None
        if found is not None and facts != found:
            raise EstimateError(f"{file}: case {i}: metadata.scenario differs from case 0's; one file, one scenario")
        found = facts
    return found


def _tokens(step: str, facts: Optional[ScenarioFacts], time_us: float, file: str,
            complete: bool) -> Optional[StepTokens]:
    if facts is None:
        return None
    from operatorx.catalog.errors import CatalogError
    from operatorx.catalog.serving import Scenario

    sc = Scenario(isl=facts.isl, osl=facts.osl, conc=facts.conc, tp=facts.tp, dp=facts.dp, ep=facts.ep,
                  mtp=facts.mtp, chunk=facts.chunk)
    try:
        sc.check()
    except CatalogError as err:
        raise EstimateError(f"{file}: metadata.scenario: {err}") from None
    batch = sc.decode_batch() if step == "decode" else sc.prefill_batch()
    tokens = sum(g["count"] * g["q"] for g in batch["groups"])
    rule = (f"decode: conc/dp x (1 + mtp) = {facts.conc}/{facts.dp} x {1 + facts.mtp} verified tokens per dp rank "
            "(acceptance not modelled)" if step == "decode" else
            f"prefill: one chunk of {tokens} tokens per dp rank (chunk {facts.chunk}, isl {facts.isl})")
    rule += f"; over its tp = {facts.tp} GPUs, per step time"
    per_s = tokens / facts.tp / (time_us * 1e-6) if time_us > 0 and complete else None
    if not complete:
        rule += " (not given: some ops of the step were not measured)"
    return StepTokens(tokens_per_dp_rank=tokens, gpus_per_dp_rank=facts.tp, tokens_per_s_per_gpu=per_s, rule=rule)


def _shares(times: dict[str, float], total_us: float) -> list[Share]:
    return [Share(name=k, time_us=v, share=v / total_us if total_us else 0.0)
            for k, v in sorted(times.items(), key=lambda kv: -kv[1])]


def _unmeasured(case: Case, row: Optional[Row]) -> Unmeasured:
    status: UnmeasuredStatus = "not in run" if row is None else row.status  # type: ignore[assignment]
    return Unmeasured(label=case.label(), op_class=case.family, roles=_roles(case), count=case.count or 0,
                      status=status, reason=None if row is None else row.message)


def _module_of(role: str) -> str:
    """The module an attention case's role belongs to: `self_attn:sliding` -> `self_attn`."""
    return role.split(":", 1)[0]


def _whole(unmeasured: list[Unmeasured]) -> bool:
    """Whether the step's time covers all of its work: every op has an ok row. An attention case
    without one is not covered by its module's GEMM roles: they time the projections, not the
    attention over the cache."""
    return not unmeasured


def _step(name: str, cases: list[Case], rows: dict[str, Row], facts: Optional[ScenarioFacts],
          file: str) -> StepEstimate:
    ok = {c.key() for c in cases if (r := rows.get(c.key())) is not None and r.status == "ok"}
    # attention modules of the step: role -> (its count, its row ok)
    modules: dict[str, tuple[int, bool]] = {}
    for c in cases:
        if c.family == "attention":
            for role in _roles(c):
                modules[role] = (c.count or 0, c.key() in ok)
    # the GEMM roles `<module>.*` an ok attention case stands for, by module: a layer kind's case
    # (`self_attn:sliding`, DeepSeek-V4's `attn:c4`) runs the projections of its own layers of `<module>`
    replaced: dict[str, int] = defaultdict(int)
    for m, (n, used) in modules.items():
        if used:
            replaced[_module_of(m)] += n
    by_class: dict[str, float] = defaultdict(float)
    by_role: dict[str, float] = defaultdict(float)
    unmeasured: list[Unmeasured] = []
    measured = in_attention = counts_measured = 0
    total = 0.0
    for c in cases:
        count = c.count or 0
        roles = _roles(c)
        if c.family == "gemm" and replaced:
            mine = [r for r in roles if r.split(".", 1)[0] in replaced and "." in r]
            if mine:
                kept = count - sum(replaced[r.split(".", 1)[0]] for r in mine)
                if kept == 0 and len(mine) == len(roles):         # wholly inside attention cases
                    measured += 1
                    in_attention += 1
                    counts_measured += count
                    continue
                if kept < 1:
                    raise EstimateError(f"{file}: {name} case {c.label()}: count {count} does not cover its "
                                        f"roles {', '.join(roles)} (each attention role runs once per layer)")
                # what is left: other modules' roles, or the layers of these roles no ok case stands for
                roles, count = [r for r in roles if r not in mine] or roles, kept
        row = rows.get(c.key())
        if c.key() not in ok or row is None or row.latency_us is None:
            unmeasured.append(_unmeasured(c, row))
            continue
        time_us = count * row.latency_us
        total += time_us
        measured += 1
        counts_measured += c.count or 0
        by_class[c.family] += time_us
        by_role[" + ".join(roles)] += time_us
    attention = [AttentionChoice(module=m, used="attention case" if used else "gemm roles",
                                 why="its row is ok" if used else "the attention case has no ok row")
                 for m, (_, used) in modules.items()]
    return StepEstimate(step=name, time_us=total, ops=len(cases), ops_measured=measured,
                        ops_in_attention=in_attention, counts=sum(c.count or 0 for c in cases),
                        counts_measured=counts_measured, by_class=_shares(by_class, total),
                        by_role=_shares(by_role, total), attention=attention, unmeasured=unmeasured,
                        tokens=_tokens(name, facts, total, file, complete=_whole(unmeasured)))


def estimate(cases: list[Case], rows: list[Row], *, run: str, file: str) -> Estimate:
    """Each step of the scenario `cases` (the file's entries, as written) timed by the run's `rows`."""
    for i, c in enumerate(cases):
        for field in ("count", "step"):
            if getattr(c, field) is None:
                raise EstimateError(f"{file}: case {i}: no `{field}`; a scenario file is written by "
                                    "`operatorx testlist serving`")
    facts = _scenario(cases, file)
    index = _index(rows, run)
    steps: dict[str, list[Case]] = {}
    for c in cases:
        steps.setdefault(str(c.step), []).append(c)
    return Estimate(run=run, scenario_file=file, scenario=facts,
                    steps=[_step(name, cs, index, facts, file) for name, cs in steps.items()])
