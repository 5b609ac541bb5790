"""Which stored runs the dashboard compares without being told, and why each pair was chosen.

Two runs are comparable when a comparison of them can say something: the same testlist, the same
backend and the same shard (so they timed the same cases the same way), neither an A/B run (it is a
comparison already, of its own two sides), not two shards of one run group (they hold different
cases), and they differ in what a comparison is for: the GPU (its name; the device on the CPU) or a
version both record (torch, vLLM, OperatorX, the git commit). Runs that differ in nothing are not
paired: a re-run is noise, not a change.

Each run is compared with the newest earlier run comparable with it, so five comparable runs give
four comparisons (a chain), each run is the newer side of one at most, and nothing is paired when
nothing is comparable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from operatorx.web.views import RunSummary

__all__ = ["Pairing", "why_comparable", "comparable_pairs", "newest_pairs", "previous_pairs", "VERSION_KEYS"]

VERSION_KEYS = (("torch", "torch"), ("vllm", "vLLM"), ("operatorx", "OperatorX"), ("git_commit", "git"))
"""The versions a pair may differ in (`RunSummary.versions` keys), with how a reason names each."""


@dataclass(frozen=True)
class Pairing:
    """Run `a` (the older, the baseline) against run `b`, both ids as pages show them, and why."""
    a: str
    b: str
    why: str


def _same_work(a: RunSummary, b: RunSummary) -> bool:
    """The same cases timed the same way: testlist, backend, shard; no A/B run; not one sweep's shards."""
    return (a.kind == b.kind == "run" and a.testlist == b.testlist and a.backend == b.backend
            and a.shard == b.shard and not (a.run_group and a.run_group == b.run_group))


def _differences(a: RunSummary, b: RunSummary) -> list[str]:
    """What differs between the two, as a reason names it: `GPU X vs Y`, `torch 2.11.0 vs 2.13.0`."""
    out = []
    gpu_a, gpu_b = a.gpu or a.device, b.gpu or b.device
    if gpu_a != gpu_b:
        out.append(f"GPU {gpu_a} vs {gpu_b}")
    for key, name in VERSION_KEYS:
        va, vb = a.versions.get(key), b.versions.get(key)
        if va and vb and va != vb:
            if key == "git_commit":
                va, vb = _short_commit(va), _short_commit(vb)
            out.append(f"{name} {va} vs {vb}")
    return out


def _short_commit(sha: str) -> str:
    return sha[:12] + ("-dirty" if sha.endswith("-dirty") else "")


def _same(a: RunSummary) -> str:
    shard = f", shard {a.shard}" if a.shard else ""
    return f"same testlist {a.testlist}, backend {a.backend}{shard}"


def why_comparable(a: RunSummary, b: RunSummary) -> Optional[str]:
    """Why `a` and `b` are worth comparing (`same testlist t, backend torch; GPU X vs Y`), or None."""
    if not _same_work(a, b):
        return None
    diff = _differences(a, b)
    return f"{_same(a)}; {'; '.join(diff)}" if diff else None


def _in_order(runs: list[RunSummary]) -> list[list[RunSummary]]:
    """The runs that may be paired at all (same testlist, backend, shard; no A/B run), in buckets,
    each in start order: a run is only looked for among its own bucket's earlier runs."""
    buckets: dict[tuple[str, str, Optional[str]], list[RunSummary]] = {}
    for r in sorted(runs, key=lambda r: (r.started_at, r.id)):
        if r.kind == "run":
            buckets.setdefault((r.testlist, r.backend, r.shard), []).append(r)
    return list(buckets.values())


def _by_start(pairs: list[Pairing], runs: list[RunSummary]) -> list[Pairing]:
    start = {r.id: (r.started_at, r.id) for r in runs}
    return sorted(pairs, key=lambda p: start[p.b])


def comparable_pairs(runs: list[RunSummary]) -> list[Pairing]:
    """Each run against the newest earlier run comparable with it (the module's rule), by the newer
    run's start."""
    out = []
    for bucket in _in_order(runs):
        for i, b in enumerate(bucket):
            for a in reversed(bucket[:i]):
                why = why_comparable(a, b)
                if why:
                    out.append(Pairing(a.id, b.id, why))
                    break
    return _by_start(out, runs)


def newest_pairs(runs: list[RunSummary]) -> list[Pairing]:
    """Of `comparable_pairs`, the newest of each testlist, backend and shard."""
    by_run = {r.id: r for r in runs}
    newest: dict[tuple[str, str, Optional[str]], Pairing] = {}
    for p in comparable_pairs(runs):
        b = by_run[p.b]
        newest[(b.testlist, b.backend, b.shard)] = p
    return list(newest.values())


def previous_pairs(runs: list[RunSummary]) -> list[Pairing]:
    """Each run against the run just before it that timed the same work (`_same_work`), whether or not
    anything differs: a re-run against the run it repeats."""
    out = []
    for bucket in _in_order(runs):
        for i, b in enumerate(bucket):
            for a in reversed(bucket[:i]):
                if _same_work(a, b):
                    diff = _differences(a, b)
                    out.append(Pairing(a.id, b.id, f"{_same(a)}; " + ("; ".join(diff) or "the run before it")))
                    break
    return _by_start(out, runs)
