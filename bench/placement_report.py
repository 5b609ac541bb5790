"""Placement and A/B readings of stored runs, one line per case (issue 32's H200 checks):

    python bench/placement_report.py DB                 # every run in DB: latency, placement spread
    python bench/placement_report.py DB --ab            # ab runs: device B−A, interval, verdict, spreads
"""

from __future__ import annotations

import argparse

from operatorx.store import Store


def _ab_line(ab: dict) -> str:
    nan = float("nan")
    dev = ab.get("device") or {}
    spread = (dev.get("placement") or {}).get("spread_pct") or {}
    planted = ((ab.get("sides") or {}).get("b") or {}).get("metadata", {}).get("planted_pct")
    return (f"A {dev.get('a_us', nan):9.2f} B {dev.get('b_us', nan):9.2f} B-A {dev.get('diff_us', nan):+8.3f} "
            f"[{dev.get('ci_low_us', nan):+.3f}, {dev.get('ci_high_us', nan):+.3f}] "
            f"rel {100 * dev.get('rel_diff', nan):+6.2f}% {dev.get('verdict')!s:12s} "
            f"spread A {spread.get('a', nan):5.2f}% B {spread.get('b', nan):5.2f}%  "
            f"numbers: {dev.get('numbers_verdict') or '-'}" + (f"  planted {planted:+.2f}%" if planted else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db")
    ap.add_argument("--ab", action="store_true")
    args = ap.parse_args()
    store = Store(args.db, create=False)
    for run in sorted(store.list_runs(), key=lambda r: r["started_at"]):
        print(f"run {run['id']} backend {run.get('backend')}")
        for row in store.rows(run["id"]):
            label = row.label()
            if row.status != "ok":
                print(f"  {label:48s} {row.status}: {(row.message or '')[:100]}")
                continue
            if args.ab:
                print(f"  {label:48s} {_ab_line(row.ab or {})}")
                continue
            p = row.placement
            per = " ".join(f"{x:.2f}" for x in p.per_placement_us) if p else "-"
            h = row.host
            host = "" if h is None else (f"  host {h.host_us_per_call:9.2f} µs IQR {h.spread_pct or 0:5.1f}% "
                                         f"bound {h.host_bound} {h.unstable_why or h.host_bound_why or ''}")
            print(f"  {label:48s} {row.measured.latency_us:10.2f} µs  spread "
                  f"{p.spread_pct if p else float('nan'):5.2f}%  [{per}]{host}")


if __name__ == "__main__":
    main()
