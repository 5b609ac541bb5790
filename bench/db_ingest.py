"""Ingest of one 5,000-row result document into PostgreSQL (target: < 10 s), and into SQLite.

Run on any machine with PostgreSQL (CPU is enough):
    python bench/db_ingest.py [--rows 5000] [--repeats 3] [--pg postgresql://postgres@127.0.0.1:5432/postgres]
Creates a throwaway database `ox_bench_<hex>` on that server and drops it after. Each repeat times
the whole `operatorx db ingest` path in-process: parse the JSON file, check and type every row
(`Row.from_json`), and store it (the first repeat inserts, later ones replace the run, atomically).
Prints one line per repeat and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from db_common import document, pg_database, versions  # noqa: E402

from operatorx.store import Store, write_json_atomic  # noqa: E402
from operatorx.store.ingest import prepare_document, read_document, store_document  # noqa: E402


def _time_ingest(db: str, path: Path, repeats: int) -> list[dict[str, float]]:
    out = []
    store = Store(db)
    for _ in range(repeats):
        t0 = time.perf_counter()
        prep = prepare_document(read_document(path), str(path))
        t1 = time.perf_counter()
        got = store_document(store, prep)
        t2 = time.perf_counter()
        assert got["rows"] == len(prep.rows) and store.row_count(prep.run_id) == got["rows"]
        out.append({"check_s": t1 - t0, "store_s": t2 - t1, "total_s": t2 - t0})
    store.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres",
                    help="URL of the server's maintenance database (a throwaway database is made beside it)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "doc.json"
        write_json_atomic(document("bench-ingest", args.rows), path)
        size_mb = path.stat().st_size / 1e6
        print(f"document: {args.rows} rows, {size_mb:.1f} MB")
        results = {"rows": args.rows, "document_mb": round(size_mb, 1), "versions": versions(),
                   "cpu_count": os.cpu_count()}
        with pg_database(args.pg) as url:
            results["postgresql"] = _time_ingest(url, path, args.repeats)
        results["sqlite"] = _time_ingest(str(Path(tmp) / "bench.db"), path, args.repeats)
    for kind in ("postgresql", "sqlite"):
        for i, r in enumerate(results[kind]):
            print(f"{kind:10s} #{i + 1} {'insert ' if i == 0 else 'replace'}: check {r['check_s']:.2f} s + "
                  f"store {r['store_s']:.2f} s = {r['total_s']:.2f} s")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
