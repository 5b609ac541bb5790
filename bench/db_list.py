"""`operatorx results list` over 1,000 runs (target: < 1 s), on PostgreSQL and SQLite.

Run on any machine with PostgreSQL (CPU is enough):
    python bench/db_list.py [--runs 1000] [--rows-per-run 20] [--repeats 5] [--pg postgresql://postgres@127.0.0.1:5432/postgres]
Fills a throwaway PostgreSQL database (`ox_bench_<hex>`, dropped after) and a temporary SQLite file
with the runs (each `--rows-per-run` rows, through the ingest path), then times:
  - in-process: the command's function with its output captured: open the store (`create=False`),
    `list_runs()`, format the table, print — everything the command does once Python has started;
  - the command itself: `python -m operatorx results list --db URL` as a subprocess, wall time, beside
    `python -m operatorx --help` (the same start-up and imports, no database) for comparison.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from db_common import document, pg_database, versions  # noqa: E402

from operatorx.store import Store  # noqa: E402
from operatorx.store.ingest import prepare_document, store_document  # noqa: E402


def _fill(db: str, runs: int, rows_per_run: int) -> None:
    store = Store(db)
    template = prepare_document(document("template", rows_per_run))
    for i in range(runs):
        day, sec = divmod(i, 86400)
        prep = template.__class__(where="bench", run_id=f"2026{11 + day:02d}30-{sec:05d}-bench", info=template.info,
                                  fields={**template.fields, "started_at": f"2026-11-30T{sec // 3600:02d}:"
                                          f"{sec // 60 % 60:02d}:{sec % 60:02d}"}, rows=template.rows)
        store_document(store, prep)
    store.close()


def _in_process(db: str) -> float:
    """The command's own function, its output captured: open, list, format, print."""
    from operatorx.cli import results

    buf = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(buf):
        results.list_runs(db=db, limit=None, as_json=False)
    elapsed = time.perf_counter() - t0
    assert buf.getvalue().count("\n") >= 1002, buf.getvalue()[:500]        # header, rule, a line per run
    return elapsed


def _command(args: list[str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "operatorx", *args], capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    assert p.returncode == 0, p.stderr[-2000:]
    return elapsed


def _measure(db: str, repeats: int) -> dict[str, list[float]]:
    return {"in_process_s": [_in_process(db) for _ in range(repeats)],
            "command_s": [_command(["results", "list", "--db", db]) for _ in range(repeats)],
            "startup_only_s": [_command(["--help"]) for _ in range(repeats)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--rows-per-run", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = ap.parse_args()
    out = {"runs": args.runs, "rows_per_run": args.rows_per_run, "versions": versions(), "cpu_count": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp, pg_database(args.pg) as url:
        sqlite_db = str(Path(tmp) / "bench.db")
        for kind, db in (("postgresql", url), ("sqlite", sqlite_db)):
            t = time.perf_counter()
            _fill(db, args.runs, args.rows_per_run)
            print(f"{kind}: filled {args.runs} runs x {args.rows_per_run} rows in {time.perf_counter() - t:.1f} s")
            out[kind] = _measure(db, args.repeats)
    for kind in ("postgresql", "sqlite"):
        m = out[kind]
        med = {k: statistics.median(v) for k, v in m.items()}      # type: ignore[union-attr]
        print(f"{kind:10s} results list: in-process {med['in_process_s']:.3f} s (median of {args.repeats}), "
              f"command {med['command_s']:.2f} s, of which start-up (--help) {med['startup_only_s']:.2f} s")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
