"""Do `results compare`'s launch-gap flags mark the multi-kernel cases whose span moved between two
runs? (issue 15, benchmarks §21)

Every pair of runs in a database (e.g. `operatorx run -t gemm_fp8` a few times, each a fresh worker):
the workers' launch-gap readings, then for the cases of several kernels, the span verdicts of the
flagged and of the unflagged cases, and the busy verdicts of the same cases:

    python bench/compare_levels.py /tmp/c.db
"""

from __future__ import annotations

import itertools
import sys
from collections import Counter


def main() -> None:
    from operatorx.report.compare import compare_documents
    from operatorx.result import Row
    from operatorx.store import Store

    store = Store(sys.argv[1])
    runs = sorted(store.list_runs(), key=lambda r: r["started_at"])
    docs = {r["id"]: store.document(r["id"]) for r in runs}
    for run_id, doc in docs.items():
        levels = [(w.get("launch_gap") or {}).get("gap_us") for w in (doc["run"].get("workers") or {}).values()]
        print(f"run {run_id}: launch gap {levels}")
    for a, b in itertools.combinations(docs, 2):
        span = compare_documents(docs[a], docs[b])
        busy = {c.case_key: c.verdict for c in compare_documents(docs[a], docs[b], metric="busy").cases}
        rows = {Row.from_json(r).case.key(): Row.from_json(r) for r in docs[a]["rows"]}
        multi = [c for c in span.cases if (row := rows.get(c.case_key)) is not None and row.ran is not None
                 and row.ran.profile is not None and row.ran.profile.kernels_per_call > 1]
        flagged = [c for c in multi if any(f.startswith("launch-gap") for f in c.flags)]
        others = [c for c in multi if c not in flagged]
        run_flag = [f for f in span.flags if f.startswith("launch-gap")]
        print(f"{a} vs {b}: {len(multi)} multi-kernel cases; run flag: {run_flag[0][:60] if run_flag else 'none'}")
        for name, group in (("flagged", flagged), ("not flagged", others)):
            if group:
                ratios = sorted(c.ratio for c in group if c.ratio)
                print(f"  {name:11s} {len(group):3d}: span {dict(Counter(c.verdict for c in group))}, busy "
                      f"{dict(Counter(busy[c.case_key] for c in group))}, span ratio "
                      f"{ratios[0]:.3f}-{ratios[-1]:.3f}" if ratios else "")


if __name__ == "__main__":
    main()
