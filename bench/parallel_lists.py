"""Issue 34's sweep of upstream's parallel testlists on one host of W GPUs: the cases that fit, and what
their rows say.

    python bench/parallel_lists.py write --max-world 2 --out DIR [gemm_parallel moe_parallel smoke_parallel]
    python bench/parallel_lists.py audit DOC_OR_DIR... [--device cuda]

`write` keeps the cases of tests/spec/upstream/NAME.json whose `parallel` tp·dp is at most --max-world
(the rest would be `unsupported: needs tp·dp = 4 GPUs ...` on this host) and writes them, case text
unchanged, to DIR/NAME_w2.json; it prints how many of each list it kept.

`audit` reads result documents (RUN_ID.json, from `operatorx run --results-dir`) and prints per document
the run's backend and software, the counts by status, every error row (kind and message), each distinct
`unsupported` reason with its count, and per multi-rank `ok` row its world, skew and per-rank GPU,
latency, collective time and telemetry. Exit 1 when a rule of the issue fails: an error or missing row,
or a multi-rank ok row without `ranks.skew_us`, without W per-rank lines on distinct GPUs, or (CUDA)
a rank without telemetry. Why: the device session reads one short summary instead of the documents.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

UPSTREAM = Path(__file__).resolve().parents[1] / "tests" / "spec" / "upstream"
LISTS = ("gemm_parallel", "moe_parallel", "smoke_parallel")


def world_of(case: dict[str, Any]) -> int:
    """tp·dp of a raw case (1 without `parallel`): the ranks it runs over."""
    par = (case.get("args") or {}).get("parallel") or {}
    return int(par.get("tp", 1)) * int(par.get("dp", 1))


def write(names: Sequence[str], max_world: int, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        raw = json.loads((UPSTREAM / f"{name}.json").read_text())
        cases = raw["cases"] if isinstance(raw, dict) else raw
        kept = [c for c in cases if world_of(c) <= max_world]
        doc: Any = {**raw, "cases": kept} if isinstance(raw, dict) else kept
        path = out / f"{name}_w{max_world}.json"
        path.write_text(json.dumps(doc, indent=1) + "\n")
        worlds = Counter(world_of(c) for c in kept)
        print(f"{path}: {len(kept)} of {len(cases)} cases (by world: {dict(sorted(worlds.items()))})")
    return 0


def documents(paths: Sequence[Path]) -> list[Path]:
    found: list[Path] = []
    for p in paths:
        found += sorted(p.glob("*.json")) if p.is_dir() else [p]
    return found


def rank_problems(row: dict[str, Any], device: Optional[str]) -> list[str]:
    """What a multi-rank ok row lacks of the issue's rules (skew, W lines on distinct GPUs, telemetry)."""
    ranks = (row.get("metrics") or {}).get("ranks")
    if not ranks:
        return []
    lines, world, out = ranks.get("per_rank") or [], ranks.get("world"), []
    if ranks.get("skew_us") is None:
        out.append("no skew_us")
    if len(lines) != world:
        out.append(f"{len(lines)} per-rank lines for world {world}")
    if device == "cuda":
        gpus = [ln.get("gpu") for ln in lines]
        if None in gpus or len(set(gpus)) != len(gpus):
            out.append(f"per-rank gpus {gpus}")
        bare = [ln.get("rank") for ln in lines if not (ln.get("telemetry") or {}).get("available")]
        if bare:
            out.append(f"no telemetry on rank(s) {bare}")
    return out


def _f(v: Any, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def audit_one(path: Path, device: Optional[str]) -> int:
    doc = json.loads(path.read_text())
    run, rows = doc.get("run") or {}, doc.get("rows") or []
    kind = device or run.get("device_kind")
    software = run.get("software") or {}
    print(f"== {path.name}: {run.get('testlist')} backend {run.get('backend')} on {kind} "
          f"({run.get('state')}; git {str(run.get('git_sha'))[:12]})")
    if software:
        print("   software: " + ", ".join(f"{k} {v}" for k, v in software.items() if isinstance(v, (str, int, float))))
    counts = Counter(r.get("status") for r in rows)
    print("   status: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: str(kv[0]))))
    bad = counts.get("error", 0) + counts.get("missing", 0)
    for r in rows:
        if r.get("status") in ("error", "missing"):
            print(f"   ERROR {r.get('label')}: {r.get('status')} {r.get('error_kind')}: {str(r.get('message'))[:400]}")
    reasons = Counter(str(r.get("message")) for r in rows if r.get("status") == "unsupported")
    for why, n in reasons.most_common():
        print(f"   unsupported x{n}: {why[:300]}")
    for r in rows:
        m = r.get("metrics") or {}
        ranks = m.get("ranks")
        if r.get("status") != "ok" or not ranks:
            continue
        per = "; ".join(f"r{ln.get('rank')} gpu{ln.get('gpu')} {_f(ln.get('latency_us'))} µs coll "
                        f"{_f(ln.get('collective_us'))} sm "
                        f"{((ln.get('telemetry') or {}).get('sm_clock_mhz') or {}).get('p50', '-')} MHz"
                        for ln in ranks.get("per_rank") or [])
        problems = rank_problems(r, kind)
        bad += bool(problems)
        print(f"   ok {r.get('label')}: {_f(m.get('latency_us'))} µs world {ranks.get('world')} skew "
              f"{_f(ranks.get('skew_us'))} | {per}" + (f"  PROBLEM: {', '.join(problems)}" if problems else ""))
    return bad


def audit(paths: Sequence[Path], device: Optional[str]) -> int:
    docs = documents(paths)
    if not docs:
        print("no result documents found in " + ", ".join(map(str, paths)))
        return 1
    bad = sum(audit_one(p, device) for p in docs)
    print(f"{'OK' if not bad else 'PROBLEMS'}: {bad} row(s) break the rules, over {len(docs)} document(s)")
    return 1 if bad else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="the cases of upstream's parallel lists that fit on W GPUs")
    w.add_argument("names", nargs="*", default=list(LISTS))
    w.add_argument("--max-world", type=int, default=2)
    w.add_argument("--out", type=Path, required=True)
    a = sub.add_parser("audit", help="counts, errors, reasons and rank telemetry of result documents")
    a.add_argument("paths", nargs="+", type=Path)
    a.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: the run's device kind")
    opts = p.parse_args(argv)
    if opts.cmd == "write":
        return write(opts.names, opts.max_world, opts.out)
    return audit(opts.paths, opts.device)


if __name__ == "__main__":
    sys.exit(main())
