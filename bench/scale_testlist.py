"""How long validating, planning and storing a large testlist takes, and the memory it needs (CPU only).

    python bench/scale_testlist.py [--cases 100000] [--copies 1] [--db PATH_OR_URL] [--keep DIR]

Writes a synthetic testlist of `--cases` distinct small bf16 gemm cases (each with its own `m` and
one source; `--copies C` writes every case C times, the extra copies only adding sources), then
times, in this one process, what `operatorx run` does before its first worker gets a case:
- `load`: `read_testlist` (strict JSON, one validated Case per entry, duplicates merged);
- `plan`: `select_cases` (no filter, no shard) and the run's `Plan` of `missing` rows, as `run` builds it;
- `store`: `Store.begin_run` with those rows, into a fresh SQLite file (or `--db`, e.g. a
  PostgreSQL URL of a database made for it).
Prints wall seconds per phase (and the process's CPU seconds beside them: the machine may be shared),
the total, and the process's peak resident memory (ru_maxrss), so one call measures one N; run it
once per N for the numbers in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def write_testlist(path: Path, cases: int, copies: int) -> int:
    """A testlist of `cases` distinct gemm cases, each written `copies` times; returns the bytes written."""
    with path.open("w") as f:
        f.write("[\n")
        first = True
        for copy in range(copies):
            for i in range(cases):
                args = {"m": i + 1, "n": 256, "k": 512, "a": {"dtype": "bf16"}, "b": {"dtype": "bf16"}, "out": "bf16"}
                item = {"type": "gemm", "args": args, "sources": [f"org/model-{copy}/layers.{i % 61}.q_proj"]}
                f.write(("" if first else ",\n") + json.dumps(item))
                first = False
        f.write("\n]\n")
    return path.stat().st_size


def peak_rss_mib() -> float:
    """The process's peak resident set so far, in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(path: Path, db: str) -> dict[str, Any]:
    from operatorx.bulk import gc_paused

    out: dict[str, Any] = {}
    with gc_paused():                        # as run/sweep.py `_new_run` loads, plans and stores
        out.update(_phases(path, db))
    return out


def _phases(path: Path, db: str) -> dict[str, Any]:
    from operatorx.result import Plan
    from operatorx.run.plan import select_cases
    from operatorx.spec.testlist import read_testlist
    from operatorx.store import Store

    out: dict[str, Any] = {}
    c0, t0 = time.process_time(), time.perf_counter()
    loaded = read_testlist(path)
    c1, t1 = time.process_time(), time.perf_counter()
    chosen = select_cases(loaded.cases, None, None, None, indexes=loaded.indexes)
    planned = Plan(chosen, "torch", str(path))
    c2, t2 = time.process_time(), time.perf_counter()
    store = Store(db)
    store.begin_run("scale-bench", "2026-12-01T00:00:00", str(path), "torch", "cpu", {"bench": "scale_testlist"},
                    planned)
    c3, t3 = time.process_time(), time.perf_counter()
    out.update(cases_in_file=loaded.entries, cases=len(loaded.cases), duplicates_merged=loaded.duplicates,
               load_s=t1 - t0, plan_s=t2 - t1, store_s=t3 - t2, total_s=t3 - t0,
               load_cpu_s=c1 - c0, plan_cpu_s=c2 - c1, store_cpu_s=c3 - c2, total_cpu_s=c3 - c0,
               rows_stored=store.row_count("scale-bench"), peak_rss_mib=peak_rss_mib())
    store.close()
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=100_000, help="distinct cases in the testlist")
    ap.add_argument("--copies", type=int, default=1, help="times each case is written (duplicates merged on load)")
    ap.add_argument("--db", default=None, help="the database to store into (default: a fresh SQLite file)")
    ap.add_argument("--keep", type=Path, default=None, help="write the testlist and database here, and keep them")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        where = args.keep or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        path = where / f"scale-{args.cases}x{args.copies}.json"
        t0 = time.perf_counter()
        size = write_testlist(path, args.cases, args.copies)
        written_s = time.perf_counter() - t0
        db = args.db or str(where / f"scale-{args.cases}x{args.copies}.db")
        if args.db is None:
            Path(db).unlink(missing_ok=True)
        got = measure(path, db)
    print(f"testlist: {got['cases_in_file']:,} entries, {got['cases']:,} cases "
          f"({got['duplicates_merged']:,} duplicates merged), {size / 2**20:.1f} MiB, written in {written_s:.1f} s")
    for phase in ("load", "plan", "store", "total"):
        extra = f"   ({got['rows_stored']:,} missing rows)" if phase == "store" else \
            f"   peak RSS {got['peak_rss_mib']:,.0f} MiB" if phase == "total" else ""
        print(f"{phase:6} {got[phase + '_s']:8.2f} s  (CPU {got[phase + '_cpu_s']:.2f} s){extra}")
    print(json.dumps(got))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
