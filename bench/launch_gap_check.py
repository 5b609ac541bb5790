"""Does a worker's launch-gap probe read the level its own multi-kernel calls see? (issue 15, §21)

For each result database given (one `operatorx run` each, a fresh worker each): the worker's probe
reading (`launch_gap_us` of its rows) beside the gaps per kernel boundary of its small multi-kernel
calls ((span - busy) / (kernels - 1), calls under 80 µs with 5 kernels or more), by scheme:

    python bench/launch_gap_check.py /tmp/v1.db /tmp/v2.db ...
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import sys


def main() -> None:
    for path in sys.argv[1:]:
        con = sqlite3.connect(path)
        level = None
        by_scheme: dict[str, list[float]] = {}
        for latency_us, busy_us, record in con.execute(
                "select latency_us, busy_us, record from ox_rows where status = 'ok'"):
            metrics = json.loads(record).get("metrics") or {}
            level = (metrics.get("timing") or {}).get("launch_gap_us", level)
            kernels = sum(k.get("count_per_call") or 0 for k in (metrics.get("profile") or {}).get("kernels") or [])
            if kernels >= 5 and busy_us and latency_us < 80:
                by_scheme.setdefault(str(metrics.get("scheme")), []).append((latency_us - busy_us) / (kernels - 1))
        print(f"{path}: probe {level}")
        for scheme, gaps in sorted(by_scheme.items()):
            print(f"  {len(gaps):3d} calls, gap per boundary median {statistics.median(gaps):.3f} µs "
                  f"(min {min(gaps):.3f}, max {max(gaps):.3f})  {scheme[:70]}")


if __name__ == "__main__":
    main()
