"""The GPUs page: runs of one testlist on different GPUs, case by case against a baseline run.

Which runs (`fleet_runs`): of the testlist's runs, the newest of each (GPU, backend); A/B runs and
the shards of a sweep (one part of it, on the run group page) are left out. A page may name its runs.

What it computes (`fleet_page`), for every run as the baseline in turn (the page picks one):
- per case, the speedup of each run: baseline latency / its latency (> 1: faster than the baseline),
  where both rows are ok with a latency;
- per model (the checkpoint part of a case's `sources`), the geometric mean of those speedups, and
  over all cases;
- per run, how many cases it is faster, slower or equal on.
Across all runs at once: per case the run with the lowest latency wins it (an exact tie for the
lowest is nobody's win; a case only one run has ok is no contest), and each run's coverage: its ok,
unsupported, error and missing cases, where a case absent from its rows counts as missing (`absent`
says how many of those). Medians only: no interval, so a 1% win is a win; `results compare` gives
the verdict with its interval for any two of these runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from operatorx.web.views import STATUSES, RowView, RunSummary

__all__ = ["FleetCase", "FleetRun", "ModelSpeedup", "BaselineView", "Coverage", "FleetPage", "fleet_runs",
           "fleet_page", "geomean", "NO_MODEL", "MAX_FLEET_RUNS"]

MAX_FLEET_RUNS = 16
"""Runs one GPUs page holds at most: every run is a baseline, so the page grows with their square."""
NO_MODEL = "(no source)"
"""The model of a case without `sources`."""


def geomean(values: list[float]) -> Optional[float]:
    """The geometric mean of positive finite values; None for none."""
    good = [v for v in values if math.isfinite(v) and v > 0]
    return math.exp(sum(math.log(v) for v in good) / len(good)) if good else None


@dataclass(frozen=True)
class FleetRun:
    run: RunSummary
    name: str
    """How the page names it: GPU (or device) · backend, with the run id where two share that."""

    def to_json(self) -> dict[str, Any]:
        return {"run": self.run.to_json(), "name": self.name}


@dataclass(frozen=True)
class FleetCase:
    key: str
    label: str
    family: str
    models: list[str]
    status: list[str]
    """Per run (in the page's order): the row's status; `absent` where the run has no row for the case."""
    latency_us: list[Optional[float]]
    """Per run: the ok row's latency, else None."""
    index: list[Optional[int]]
    """Per run: the case index of its row there (for links), else None."""
    winner: Optional[int] = None
    """The position of the run with the lowest latency, where at least two runs have one and no tie."""


@dataclass(frozen=True)
class ModelSpeedup:
    model: str
    geomean: list[Optional[float]]
    """Per run: the geometric-mean speedup over the model's cases both it and the baseline have ok."""
    cases: list[int]
    """Per run: how many cases went into it."""


@dataclass(frozen=True)
class BaselineView:
    baseline: int
    """The position of the baseline run."""
    speedups: list[list[Optional[float]]]
    """Per case (the page's order), per run: baseline latency / its latency."""
    models: list[ModelSpeedup]
    overall: ModelSpeedup
    faster: list[int]
    """Per run: cases it is faster on than the baseline (speedup > 1)."""
    slower: list[int]
    equal: list[int]


@dataclass(frozen=True)
class Coverage:
    counts: dict[str, int]
    """ok, unsupported, error, missing; missing counts a case absent from the run's rows too."""
    absent: int


@dataclass(frozen=True)
class FleetPage:
    testlist: str
    runs: list[FleetRun]
    cases: list[FleetCase]
    baselines: list[BaselineView]
    coverage: list[Coverage]
    wins: list[int]
    """Per run: cases it has the lowest latency on."""
    contested: int
    """Cases at least two runs have a latency for."""
    ties: int
    """Contested cases whose lowest latency two runs share."""
    chosen: str = ""
    """How the runs were chosen."""
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "runs"}
        return {**out, "runs": [r.to_json() for r in self.runs]}


def fleet_runs(runs: list[RunSummary], testlist: str) -> list[RunSummary]:
    """The newest run of each (GPU or device, backend) of `testlist` (runs newest first, as the store
    lists them), not A/B runs nor shards; ordered by GPU then backend, at most MAX_FLEET_RUNS."""
    newest: dict[tuple[str, str], RunSummary] = {}
    for r in runs:
        if r.testlist == testlist and r.kind == "run" and not r.shard:
            newest.setdefault((r.gpu or r.device, r.backend), r)
    return [newest[k] for k in sorted(newest)][:MAX_FLEET_RUNS]


def _names(runs: list[RunSummary]) -> list[str]:
    names = [r.series for r in runs]
    return [n if names.count(n) == 1 else f"{n} ({r.id})" for n, r in zip(names, runs, strict=True)]


def _latency(v: RowView) -> Optional[float]:
    lat = v.latency_us
    return lat if v.status == "ok" and lat is not None and math.isfinite(lat) and lat > 0 else None


def _winner(latencies: list[Optional[float]]) -> tuple[Optional[int], bool, bool]:
    """(the winner's position, contested, tied)."""
    have = [(lat, i) for i, lat in enumerate(latencies) if lat is not None]
    if len(have) < 2:
        return None, False, False
    have.sort()
    if have[0][0] == have[1][0]:
        return None, True, True
    return have[0][1], True, False


def _speedups(cases: list[FleetCase], base: int, n: int) -> list[list[Optional[float]]]:
    out = []
    for c in cases:
        b = c.latency_us[base]
        out.append([b / lat if b is not None and lat is not None else None for lat in c.latency_us[:n]])
    return out


def _model_speedup(model: str, rows: list[list[Optional[float]]], n: int) -> ModelSpeedup:
    per_run = [[s[i] for s in rows if s[i] is not None] for i in range(n)]
    return ModelSpeedup(model=model, geomean=[geomean([v for v in vs if v is not None]) for vs in per_run],
                        cases=[len(vs) for vs in per_run])


def _count(speedups: list[list[Optional[float]]], i: int, test: Callable[[float], bool]) -> int:
    return sum(1 for s in speedups if (v := s[i]) is not None and test(v))


def _baseline(cases: list[FleetCase], base: int, n: int) -> BaselineView:
    speedups = _speedups(cases, base, n)
    by_model: dict[str, list[list[Optional[float]]]] = {}
    for c, s in zip(cases, speedups, strict=True):
        for model in c.models or [NO_MODEL]:
            by_model.setdefault(model, []).append(s)
    models = [_model_speedup(m, rows, n) for m, rows in sorted(by_model.items())]
    return BaselineView(
        baseline=base, speedups=speedups, models=models, overall=_model_speedup("all cases", speedups, n),
        faster=[_count(speedups, i, lambda v: v > 1) for i in range(n)],
        slower=[_count(speedups, i, lambda v: v < 1) for i in range(n)],
        equal=[_count(speedups, i, lambda v: v == 1) for i in range(n)])


def fleet_page(testlist: str, runs: list[tuple[RunSummary, list[tuple[str, RowView]]]], chosen: str = ""
               ) -> FleetPage:
    """The page over `runs`, each with its rows keyed by case identity (`Queries.gpus_page` keys them
    by the case's type, args and sources); a key twice in one run counts once, its first row. Cases
    in case-index order of the first run that has them."""
    n = len(runs)
    order: list[str] = []
    first: dict[str, RowView] = {}
    per_run: list[dict[str, RowView]] = []
    for _, rows in runs:
        mine: dict[str, RowView] = {}
        for key, v in rows:
            if key in mine:
                continue
            mine[key] = v
            if key not in first:
                first[key] = v
                order.append(key)
        per_run.append(mine)
    cases = []
    contested = ties = 0
    wins = [0] * n
    order.sort(key=lambda k: first[k].index)          # stable: one testlist's runs agree on its indexes
    for key in order:
        v0 = first[key]
        views = [mine.get(key) for mine in per_run]
        latency = [_latency(v) if v else None for v in views]
        winner, is_contest, tied = _winner(latency)
        contested += is_contest
        ties += tied
        if winner is not None:
            wins[winner] += 1
        cases.append(FleetCase(key=key, label=v0.label, family=v0.family, models=v0.models,
                               status=[v.status if v else "absent" for v in views], latency_us=latency,
                               index=[v.index if v else None for v in views], winner=winner))
    coverage = []
    for i in range(n):
        counts = dict.fromkeys(STATUSES, 0)
        absent = 0
        for c in cases:
            status = c.status[i]
            if status == "absent":
                absent += 1
                status = "missing"
            counts[status] = counts.get(status, 0) + 1
        coverage.append(Coverage(counts=counts, absent=absent))
    summaries = [r for r, _ in runs]
    return FleetPage(testlist=testlist, runs=[FleetRun(r, name) for r, name in zip(summaries, _names(summaries),
                                                                                      strict=True)],
                     cases=cases, baselines=[_baseline(cases, b, n) for b in range(n)], coverage=coverage,
                     wins=wins, contested=contested, ties=ties, chosen=chosen)
