"""Host vs device µs per call for gemm_perf through torch, and the layer breakdown of one decode GEMM.

Run on a GPU machine:  python bench/host_layers.py [--testlist gemm_perf] [--case 1x7168x2048]
Prints two tables; with $OUT set, writes $OUT/host_layers.json (every batch value kept).
Uses the same code as `operatorx run --host` (run/case.py → run/host.py), so the numbers are the
tool's own, not a side measurement.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from rich.console import Console
from rich.table import Table

from operatorx.measure import HostTimeSettings
from operatorx.report import fmt
from operatorx.run import RunConfig, run_testlist
from operatorx.spec import load_testlist, resolve_testlist


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--testlist", default="gemm_perf")
    ap.add_argument("--case", default="1x7168x2048", help="MxNxK of the decode GEMM to break down by layer")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", type=int, default=15)
    ap.add_argument("--batch-calls", type=int, default=200)
    ap.add_argument("--db", default=str(Path(os.environ.get("OUT", ".")) / "host_layers.db"))
    args = ap.parse_args()

    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    cfg = RunConfig(testlist=args.testlist, device=args.device, db=args.db, host=True,
                    host_timing=HostTimeSettings(batches=args.batches, batch_calls=args.batch_calls),
                    results_dir=(out_dir or Path(".")) / "host_layers-results", profile_kernels=False)
    outcome = run_testlist(cfg)
    con = Console(width=200)

    t = Table(title=f"{args.testlist} through torch: host vs device µs per call ({outcome.run_id})")
    for c in ("#", "case", "scheme", "status", "device_us", "host_us", "host_iqr_us", "host_bound", "note"):
        t.add_column(c, justify="left" if c in ("case", "scheme", "status", "note") else "right")
    rows = []
    for r in outcome.rows:
        m, host = r.metrics, r.metrics.get("host", {})
        note = (r.message or "") if r.status != "ok" else "; ".join(host.get("warnings", []))
        t.add_row(str(r.case_index), r.case.label(), r.case.scheme(), r.status, fmt(m.get("latency_us"), 2),
                  fmt(host.get("host_us_per_call"), 2), fmt(host.get("iqr_us"), 2), str(host.get("host_bound", "-")),
                  note[:70])
        rows.append(r.to_json())
    con.print(t)

    chosen = [r for r in outcome.rows if r.case.label() == f"gemm {args.case}" and r.status == "ok"]
    breakdown = {}
    for r in chosen:
        lt = Table(title=f"layers of {r.case.label()} {r.case.scheme()}: host µs per call "
                         f"(device {fmt(r.metrics['latency_us'], 2)} µs)")
        for c in ("layer", "host_us", "iqr_us", "output vs public", "gpu_paced"):
            lt.add_column(c)
        for name, info in r.metrics["host"].get("layers", {}).items():
            vs = info.get("error") or info.get("output_vs_public", {}).get("result") or info.get("same_as", "")
            lt.add_row(name, fmt(info.get("host_us_per_call"), 2), fmt(info.get("iqr_us"), 2), str(vs)[:60],
                       str(info.get("gpu_paced", "-")))
        con.print(lt)
        breakdown[f"{r.case.label()} {r.case.scheme()}"] = r.metrics["host"]
    if not chosen:
        known = sorted({c.label() for c in load_testlist(resolve_testlist(args.testlist))})
        con.print(f"no ok case gemm {args.case} in {args.testlist}; cases: {', '.join(known)}")

    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        doc = {"run_id": outcome.run_id, "testlist": args.testlist, "settings": cfg.host_timing.to_json(),
               "rows": rows, "layers": breakdown}
        (out_dir / "host_layers.json").write_text(json.dumps(doc, indent=1, default=str))
        con.print(f"wrote {out_dir / 'host_layers.json'}")


if __name__ == "__main__":
    main()
