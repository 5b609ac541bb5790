"""Sweep throughput against the number of GPUs, and whether the latencies agree across them.

    python bench/sweep_scaling.py --testlist gemm --limit 1000 --gpus 0 --gpus 0,1 --db /tmp/scaling.db

For each `--gpus` set: one `operatorx run` (a fresh process, its own workers), its wall time end
to end (worker start and the L2 probe included), cases/s, and the ok/unsupported/error counts.
Then, for every case ok in the first and in a later run, the relative latency difference against
the two rows' own noise (median ±): how many differ by more than their combined noise.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

from operatorx.store import Store


def _run(testlist: str, limit: int, gpus: str, db: str, extra: list[str]) -> tuple[str, float, float]:
    """(run id, wall seconds, Unix time the command started)."""
    t0_unix = time.time()
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "operatorx", "run", "-t", testlist, "--limit", str(limit),
                           "--gpus", gpus, "--db", db, "--results-dir", "/tmp/scaling-res", *extra],
                          capture_output=True, text=True)
    wall_s = time.monotonic() - t0
    if done.returncode not in (0, 1):
        sys.exit(f"run --gpus {gpus} failed ({done.returncode}): {done.stderr[-2000:]}")
    return Store(db, create=False).resolve_run("latest"), wall_s, t0_unix


def _where_time_goes(rows: list) -> None:
    """The cases' own phase seconds (case_seconds), the retried (capped) cases, the slowest cases."""
    phases: dict[str, float] = {}
    for r in rows:
        for name, sec in (r.case_seconds.model_dump() if r.case_seconds else {}).items():
            if sec is not None and name != "started_unix_s":        # a moment, not a phase
                phases[name] = phases.get(name, 0.0) + sec
    print("  case seconds by phase: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(phases.items())))
    ok = [r for r in rows if r.status == "ok" and r.measured]
    sources = {}
    for r in ok:
        src = (r.measured.timing.model_dump().get("activity_source") if r.measured.timing else None) or "-"
        sources[src] = sources.get(src, 0) + 1
    retried = [r for r in ok if r.conditions and r.conditions.telemetry
               and len(r.conditions.telemetry.model_dump().get("attempts") or []) > 1]
    retried_s = sum(r.case_seconds.total for r in retried if r.case_seconds and r.case_seconds.total)
    batches = [r.measured.timing.batches for r in ok if r.measured.timing and r.measured.timing.batches]
    print(f"  ok rows by activity source {sources}; batches per ok case mean "
          f"{sum(batches) / max(1, len(batches)):.2f}; {len(retried)} cases retried (capped), {retried_s:.1f} s")
    plain = [r for r in ok if r not in retried and r.case_seconds and r.case_seconds.total]
    if plain:
        def med(values: list) -> float:
            values = sorted(v for v in values if v is not None)
            return values[len(values) // 2] if values else float("nan")

        phases_of = [(r.measured.timing.phases.model_dump() if r.measured.timing and r.measured.timing.phases
                      else {}) for r in plain]
        print(f"  ok cases not retried ({len(plain)}): total {1e3 * med([r.case_seconds.total for r in plain]):.1f} ms "
              "median; timing phases median (ms): " + ", ".join(
                  f"{k} {1e3 * med([ph.get(k) for ph in phases_of]):.1f}"
                  for k in ("warmup_s", "batches_s", "spin_gpu_s", "loop_s"))
              + f"; enqueue {med([r.measured.timing.enqueue_us_per_call for r in plain if r.measured.timing]):.1f} "
              "us/call")
    slow = sorted((r for r in rows if r.case_seconds and r.case_seconds.total), key=lambda r: -r.case_seconds.total)
    for r in slow[:8]:
        print(f"    {r.case_seconds.total:6.2f} s  {r.status:11s} {r.case.label()[:60]}  "
              f"latency {r.latency_us or 0:.1f} us")


def _by_stop_reason(rows: list) -> None:
    """Where the ok cases' seconds go by why their sampling stopped: a case that never reaches the
    noise target samples up to `max_samples` or `max_time_s`, and a few such cases can cost more
    than hundreds of ordinary ones (issue 15's speed target)."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        if r.status == "ok" and r.measured and r.case_seconds and r.case_seconds.total:
            groups.setdefault(r.measured.stop_reason or "-", []).append(r.case_seconds.total)
    print("  ok cases by stop reason: " + "; ".join(
        f"{reason} {len(secs)} cases, {sum(secs):.1f} s" for reason, secs in sorted(groups.items())))


def _write_cases(rows: list, path: Path) -> None:
    """One line per case: what each cost and why it stopped (comes back from the device machine,
    unlike the database)."""
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["index", "label", "status", "case_s", "started_unix_s", "worker", "latency_us", "busy_us", "n",
                      "stop_reason", "noise", "batches", "attempts", "enqueue_us"])
        for r in rows:
            m, t = r.measured, (r.measured.timing if r.measured else None)
            attempts = (len(r.conditions.telemetry.model_dump().get("attempts") or [])
                        if r.conditions and r.conditions.telemetry else None)
            out.writerow([r.case_index, r.case.label(), r.status,
                          None if not r.case_seconds else r.case_seconds.total,
                          None if not r.case_seconds else r.case_seconds.started_unix_s, _card(r), r.latency_us,
                          None if not m else m.busy_us, None if not m or not m.summary_us else m.summary_us.n,
                          None if not m else m.stop_reason, None if not m else m.noise,
                          None if not t else t.batches, attempts, None if not t else t.enqueue_us_per_call])


def _worker_gaps(rows: list) -> None:
    """Per worker: the seconds between one case's end and the next one's start (the sweep's own cost:
    handing out the case, sending the row back, the memory check), from each row's start time and
    length. Rows without a start time (older runs) are left out."""
    by_worker: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        cs = r.case_seconds
        card = _card(r)
        if cs is None or cs.started_unix_s is None or cs.total is None or card is None:
            continue                # no start time (an older run), or no GPU to tell the workers apart
        by_worker.setdefault(card, []).append((cs.started_unix_s, cs.total))
    for card, spans in sorted(by_worker.items()):
        spans.sort()
        gaps = sorted(max(0.0, b[0] - (a[0] + a[1])) for a, b in zip(spans, spans[1:], strict=False))
        if gaps:
            print(f"  between cases on {card}: {len(gaps)} gaps, {sum(gaps):.2f} s in all, median "
                  f"{1e3 * gaps[len(gaps) // 2]:.2f} ms, p95 {1e3 * gaps[int(0.95 * (len(gaps) - 1))]:.2f} ms; "
                  f"first case started {spans[0][0]:.3f}, last ended {spans[-1][0] + spans[-1][1]:.3f} (Unix s)")


def _case_phase_s(rows: list) -> float | None:
    """Seconds from the first case's start to the last case's end, over all workers: the rate inside
    it is the sweep's steady state, without the fixed costs (process and worker start-up, the plan,
    the document) that the end-to-end rate carries."""
    spans = _spans(rows)
    if not spans:
        return None
    return max(a + b for a, b in spans) - min(a for a, _ in spans)


def _spans(rows: list) -> list[tuple[float, float]]:
    """(start Unix s, seconds) of every row that kept both."""
    return [(r.case_seconds.started_unix_s, r.case_seconds.total) for r in rows
            if r.case_seconds is not None and r.case_seconds.started_unix_s is not None
            and r.case_seconds.total is not None]


def _outside(rows: list, info: dict, t0_unix: float, wall_s: float) -> None:
    """The seconds outside the case phase: before the first case (the command's start, its workers'
    spawn to ready, the plan) and after the last (the run closed, its document written, exit)."""
    spans = _spans(rows)
    if not spans:
        return
    before_s = min(a for a, _ in spans) - t0_unix
    after_s = t0_unix + wall_s - max(a + b for a, b in spans)
    ready = [w.get("startup_s", {}).get("spawn_to_ready") for w in (info.get("workers") or {}).values()]
    ready = [x for x in ready if x is not None]
    print(f"  outside the case phase: {before_s:.2f} s before the first case (workers spawn to ready "
          f"{', '.join(f'{x:.2f}' for x in ready)} s), {after_s:.2f} s after the last")


def _card(row) -> str | None:
    """Which GPU timed the row (its PCI bus id, else its index)."""
    w = row.worker
    return None if w is None else (w.pci_bus_id or (None if w.index is None else f"gpu{w.index}"))


def _agreement(base_ok: dict, rows: list, what: str, label: str) -> None:
    """|relative difference| of each case ok in both runs, against the two rows' combined noise."""
    diffs, beyond = [], 0
    for r in rows:
        b = base_ok.get(r.key()[0])
        if r.status != "ok" or b is None or not b.measured or not r.measured:
            continue
        x, y = (b.latency_us, r.latency_us) if what == "span" else (b.measured.busy_us, r.measured.busy_us)
        if not x or not y:
            continue
        rel = y / x - 1
        noise = (b.measured.noise or 0) + (r.measured.noise or 0)
        diffs.append(abs(rel))
        beyond += abs(rel) > max(noise, 0.01)
    diffs.sort()
    if diffs:
        print(f"  {what} ({label}): {len(diffs)} cases; |diff| median {100 * diffs[len(diffs) // 2]:.2f}%, "
              f"p95 {100 * diffs[int(0.95 * (len(diffs) - 1))]:.2f}%; {beyond} beyond max(noise, 1%)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--testlist", default="gemm")
    ap.add_argument("--limit", type=int, default=1000)
    ap.add_argument("--gpus", action="append", required=True, help="a --gpus value; give it once per run")
    ap.add_argument("--db", default="/tmp/scaling.db")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--cases-csv", type=Path, help="write each run's cases (cost, samples, stop reason) here, "
                    "the --gpus value added to the file name")
    ap.add_argument("extra", nargs="*", help="more `operatorx run` options, after --")
    args = ap.parse_args()
    results = []
    for gpus in args.gpus:
        run_id, wall_s, t0_unix = _run(args.testlist, args.limit, gpus, args.db, args.extra)
        rows = Store(args.db, create=False).rows(run_id)
        counts = {s: sum(r.status == s for r in rows) for s in ("ok", "unsupported", "error", "missing")}
        phase_s = _case_phase_s(rows)
        results.append({"gpus": gpus, "run_id": run_id, "wall_s": wall_s, "cases_per_s": len(rows) / wall_s,
                        "case_phase_s": phase_s, "counts": counts, "rows": rows,
                        "case_phase_cases_per_s": len(rows) / phase_s if phase_s else None})
        print(f"--gpus {gpus}: {len(rows)} cases in {wall_s:.1f} s = {len(rows) / wall_s:.2f} cases/s {counts}")
        if phase_s:
            print(f"  case phase (first case's start to last case's end): {phase_s:.1f} s = "
                  f"{len(rows) / phase_s:.2f} cases/s; outside it {wall_s - phase_s:.1f} s")
        info = Store(args.db, create=False).run_info(run_id) or {}
        _outside(rows, info, t0_unix, wall_s)
        for slot, worker in sorted((info.get("workers") or {}).items()):
            print(f"  {slot} start-up (s): {worker.get('startup_s')}; clock ramp: {worker.get('clock_ramp')}")
        _where_time_goes(rows)
        _by_stop_reason(rows)
        _worker_gaps(rows)
        if args.cases_csv:
            _write_cases(rows, args.cases_csv.with_name(
                f"{args.cases_csv.stem}-gpus{gpus.replace(',', '_')}{args.cases_csv.suffix}"))
    base = results[0]
    base_ok = {r.key()[0]: r for r in base["rows"] if r.status == "ok"}
    for other in results[1:]:
        print(f"--gpus {other['gpus']} vs {base['gpus']}: {other['cases_per_s'] / base['cases_per_s']:.2f}x the rate")
        if other["case_phase_cases_per_s"] and base["case_phase_cases_per_s"]:
            print(f"  inside the case phase: "
                  f"{other['case_phase_cases_per_s'] / base['case_phase_cases_per_s']:.2f}x the rate")
        for what in ("span", "busy"):
            _agreement(base_ok, other["rows"], what, "all")
            cards = sorted({_card(r) for r in other["rows"]} - {None})
            if len(cards) > 1:          # same card as the base run vs another card: run-to-run vs card-to-card
                for card in cards:
                    _agreement(base_ok, [r for r in other["rows"] if _card(r) == card], what, f"timed on {card}")
    if args.json:
        args.json.write_text(json.dumps([{k: v for k, v in r.items() if k != "rows"} for r in results], indent=1))


if __name__ == "__main__":
    main()
