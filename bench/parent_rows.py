"""How many rows a second one sweep parent can take in: can one parent keep up with every GPU of a host?

    python bench/parent_rows.py [--rows 2000] [--document RUN.json] [--pg postgresql://...]

A worker's row reaches the parent as one JSON line; the parent parses it, validates it as a `Row`,
stores it (replacing its planned `missing` row) and prints its progress line. This times those four
steps on the parent's side only, for `--rows` rows into a fresh run, with no worker: the source rows
come from `--document` (a run's result document, e.g. from an H200 sweep), else from a small CPU run
made here (`gemm_perf`, its ok rows). Each row gets a case of its own (its `m` changed), so every store
is an update of a distinct planned row, as in a sweep. `--groups` stores the rows one per transaction
(a row that reaches the parent alone) and in groups (the rows that finished while the parent was
storing the last ones, which the scheduler hands over together). Prints microseconds per row for
each step and the rows per second one parent thread can take, against SQLite (a file) and, with
`--pg`, PostgreSQL.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from operatorx.cli.progress import LogReporter
from operatorx.result import Row
from operatorx.run.protocol import WorkerMessage, parse
from operatorx.store import Store


def _source_rows(document: Path | None, tmp: Path) -> list[dict[str, Any]]:
    if document is None:
        document = tmp / "res" / "cpu.json"
        subprocess.run([sys.executable, "-m", "operatorx", "run", "-t", "gemm_perf", "--limit", "6", "--device", "cpu",
                        "--workers", "1", "--db", str(tmp / "src.db"), "--results-dir", str(tmp / "res"),
                        "--run-id", "cpu"], check=True, capture_output=True)
    rows = [r for r in json.loads(document.read_text())["rows"] if r["status"] == "ok"]
    if not rows:
        sys.exit(f"{document}: no ok rows to replay")
    return rows


def _distinct(rows: list[dict[str, Any]], n: int) -> list[Row]:
    """`n` rows cycled from `rows`, each with a case of its own (m = its index + 1) and index."""
    out = []
    for i in range(n):
        doc = json.loads(json.dumps(rows[i % len(rows)]))
        doc["op"]["args"]["m"] = i + 1
        doc["case_index"] = i
        out.append(Row.from_json(doc))
    return out


def _time(db: str, rows: list[Row], run_id: str, group: int) -> dict[str, float]:
    store = Store(db)
    first = rows[0]
    store.begin_run(run_id, "2026-12-01T00:00:00+00:00", first.testlist or "bench", first.backend, "cpu", {},
                    [Row.missing(r.case, r.backend, r.testlist or "bench", r.case_index) for r in rows])
    lines = [WorkerMessage("row", {"index": r.case_index, "row": r.to_json(), "replace": False}).to_line()
             for r in rows]
    reporter = LogReporter(Console(file=io.StringIO(), width=200))
    reporter.start(run_id, len(rows), ["gpu0"])
    spent = {"parse": 0.0, "validate": 0.0, "store": 0.0, "report": 0.0}
    clock = time.perf_counter
    for start in range(0, len(lines), group):
        t0 = clock()
        msgs = [parse(line) for line in lines[start:start + group]]
        t1 = clock()
        got = [Row.from_json(m.body["row"]) for m in msgs if m is not None]
        t2 = clock()
        if group == 1:
            store.put_row(run_id, got[0])          # the parent's path for a row that arrives alone
        else:
            store.put_rows(run_id, got)
        t3 = clock()
        for row in got:
            reporter.case_done("gpu0", row)
        t4 = clock()
        spent["parse"] += t1 - t0
        spent["validate"] += t2 - t1
        spent["store"] += t3 - t2
        spent["report"] += t4 - t3
    stored = store.rows(run_id)
    assert sum(r.status == "ok" for r in stored) == len(rows), "every planned row replaced"
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--document", type=Path, help="a run's result document whose ok rows are replayed")
    ap.add_argument("--pg", help="a PostgreSQL URL to time as well (a scratch database: a run is added)")
    ap.add_argument("--groups", default="1,4,16", help="rows stored per transaction, one timing each")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        source = _source_rows(args.document, tmp)
        size = sum(len(json.dumps(r)) for r in source) / len(source)
        print(f"{len(source)} source rows, {size:.0f} bytes of JSON a row on average; {args.rows} rows replayed")
        targets = [("sqlite", str(tmp / "bench.db"))] + ([("postgresql", args.pg)] if args.pg else [])
        for name, db in targets:
            for group in (int(g) for g in args.groups.split(",")):
                run_id = f"parent-rows-{int(time.time() * 1000)}"
                spent = _time(db, _distinct(source, args.rows), run_id, group)
                per_row_us = {k: 1e6 * v / args.rows for k, v in spent.items()}
                total_us = sum(per_row_us.values())
                print(f"{name}, {group} a transaction: {total_us:.0f} µs a row "
                      f"({', '.join(f'{k} {v:.0f}' for k, v in per_row_us.items())}) "
                      f"= {1e6 / total_us:.0f} rows/s for one parent thread")


if __name__ == "__main__":
    main()
