"""How far the same cases move between stored runs on one GPU: per case, |latency ratio - 1| of each
case ok in both, for the span and the busy time, split by calls of one kernel and of several.

    python bench/run_agreement.py DB:RUN_ID DB:RUN_ID [DB:RUN_ID ...]   # each against the first

A run id may be `latest` or `first` (that database's newest or oldest run).
"""

from __future__ import annotations

import sys

from operatorx.store import Store


def _rows(spec: str) -> tuple[str, dict]:
    db, run = spec.rsplit(":", 1)
    store = Store(db, create=False)
    if run in ("latest", "first"):
        runs = sorted(store.list_runs(), key=lambda r: r["started_at"])
        run = runs[-1 if run == "latest" else 0]["id"]
    return run, {r.key()[0]: r for r in store.rows(run) if r.status == "ok" and r.measured}


def _kernels(row) -> float:
    profile = row.ran.profile if row.ran is not None else None
    return profile.kernels_per_call if profile is not None else 0.0


def _line(what: str, diffs: list[float]) -> str:
    diffs = sorted(diffs)
    if not diffs:
        return f"{what}: no case"
    p95 = diffs[int(0.95 * (len(diffs) - 1))]
    return (f"{what}: {len(diffs)} cases, |diff| median {100 * diffs[len(diffs) // 2]:.2f}%, p95 {100 * p95:.2f}%, "
            f"max {100 * diffs[-1]:.2f}%, beyond 1%: {sum(d > 0.01 for d in diffs)}")


def main() -> None:
    base_id, base = _rows(sys.argv[1])
    for spec in sys.argv[2:]:
        run_id, other = _rows(spec)
        print(f"{run_id} against {base_id}:")
        for kind, keep in (("one kernel", lambda k: k <= 1.0), ("several kernels", lambda k: k > 1.0)):
            span, busy = [], []
            for key, r in other.items():
                b = base.get(key)
                if b is None or not keep(_kernels(b)):
                    continue
                span.append(abs(r.latency_us / b.latency_us - 1))
                if r.measured.busy_us and b.measured.busy_us:
                    busy.append(abs(r.measured.busy_us / b.measured.busy_us - 1))
            print(f"  {_line(kind + ', span', span)}")
            print(f"  {_line(kind + ', busy', busy)}")


if __name__ == "__main__":
    main()
