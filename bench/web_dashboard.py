"""Dashboard speed (issue 13): a Run page of 5,000 rows in headless Chromium, and `report build` of
10 runs x 5,000 rows. CPU only (no GPU needed); numbers go to docs/benchmarks.md.

    python bench/web_dashboard.py [--runs 10] [--rows 5000] [--samples 500] [--db /tmp/ox_web_bench.db]

The database is made once (rows written through the Store API, shaped like a GPU run's: samples,
summary, telemetry, a two-kernel profile, the check) and reused while its size matches.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from operatorx.result import Row
from operatorx.store import Store

MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
NK = [(3072, 1536), (7168, 2048), (4608, 7168), (7168, 18432), (2112, 7168), (24576, 1536), (32768, 512),
      (7168, 16384), (1536, 7168), (4096, 4096)]
SCHEMES = [("bf16", "bf16"), ("e4m3", "e4m3")]


def _row(i: int, run_seed: int, n_samples: int) -> dict[str, Any]:
    rnd = random.Random(run_seed * 1_000_003 + i)
    m = MS[i % len(MS)]
    n, k = NK[(i // len(MS)) % len(NK)]
    a, b = SCHEMES[(i // (len(MS) * len(NK))) % len(SCHEMES)]
    k = k + 128 * (i // (len(MS) * len(NK) * len(SCHEMES)))          # more shapes past 320 rows
    args: dict[str, Any] = {"m": m, "n": n, "k": k, "a": {"dtype": a}, "b": {"dtype": b}, "out": "bf16"}
    if a == "e4m3":
        args["a"]["scale"] = {"dtype": "fp32", "static": False, "group": [1, 128]}
        args["b"]["scale"] = {"dtype": "fp32", "static": True, "group": [128, 128]}
    op = {"type": "gemm", "args": args, "backend": "torch", "sources": [f"org/model-{i % 7}/layers.mlp.role_{i % 5}"]}
    base = {"op": op, "label": f"gemm {m}x{n}x{k}", "testlist": "bench", "case_index": i, "side": ""}
    roll = rnd.random()
    if roll < 0.07:
        return {**base, "status": "unsupported", "message": f"no fp8 kernel for K={k} on this GPU (need K % 256)",
                "metrics": {}}
    if roll < 0.09:
        return {**base, "status": "error", "error_kind": "exception", "metrics": {},
                "message": f"RuntimeError: CUDA error: an illegal memory access was encountered (case {i})"}
    if roll < 0.10:
        return {**base, "status": "missing", "metrics": {}}
    flops = 2 * m * n * k
    min_bytes = (m * k + n * k) * (1 if a == "e4m3" else 2) + 2 * m * n
    lat = max(3.0, flops / 6e8 + min_bytes / 3.5e6) * rnd.uniform(0.95, 1.1)
    samples = [round(lat * rnd.uniform(0.98, 1.06), 4) for _ in range(n_samples)]
    srt = sorted(samples)
    tflops, gbps = flops / lat / 1e6, min_bytes / lat / 1e3
    return {**base, "status": "ok", "metrics": {
        "latency_us": srt[len(srt) // 2], "method": "cupti_kernels", "clock": "device", "l2_state": "cold_clean",
        "l2_verified": True, "noise": 0.004, "samples_us": samples, "stop_reason": "noise_target",
        "summary_us": {"median": srt[len(srt) // 2], "mean": sum(srt) / len(srt), "min": srt[0], "max": srt[-1],
                       "p10": srt[len(srt) // 10], "p90": srt[9 * len(srt) // 10], "iqr": 0.01, "std": 0.01,
                       "n": len(srt), "cv": 0.01, "median_noise": 0.004},
        "warmup": {"calls": 20, "seconds": 0.05},
        "telemetry": {"available": True, "capped": False, "capping_reasons": [],
                      "sm_clock_mhz": {"min": 1965, "p50": 1980, "max": 1980},
                      "power_w": {"min": 300.0, "p50": 420.0, "max": 560.0},
                      "temperature_c": {"min": 40.0, "p50": 44.0, "max": 47.0},
                      "attempts": [{"latency_us": lat, "pause_s": 0.0, "capped": False, "kept": True}]},
        "capped": False, "flops": flops, "min_bytes": min_bytes, "tflops": tflops, "gbps": gbps,
        "pct_peak": 100 * max(tflops / 989.4, gbps / 4800), "scheme": "bf16" if a == "bf16" else "fp8 block",
        "peak": {"compute_class": "bf16" if a == "bf16" else "fp8", "tflops": 989.4 if a == "bf16" else 1978.9,
                 "memory_gbps": 4800.0, "source": "vendor datasheet, dense"},
        "profile": {"calls": 8, "span_us_median": lat, "busy_us_median": lat * 0.97, "kernels": [
            {"name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "count_per_call": 1.0,
             "device_us_per_call": lat * 0.9, "device_us_median": lat * 0.9},
            {"name": "vectorized_elementwise_kernel", "count_per_call": 1.0, "device_us_per_call": lat * 0.07,
             "device_us_median": lat * 0.07}]},
        "check": {"rel_error": 0.002, "bound": 0.01, "rows_checked": 4, "reference": "fp32 matmul", "ok": True}}}


def make_db(db: Path, runs: int, rows: int, n_samples: int) -> list[str]:
    stamp = db.with_suffix(".json")
    want = {"runs": runs, "rows": rows, "samples": n_samples}
    if db.exists() and stamp.exists() and json.loads(stamp.read_text()) == want:
        return [r["id"] for r in Store(str(db), create=False).list_runs()]
    for p in (db, stamp, Path(f"{db}-wal"), Path(f"{db}-shm")):
        p.unlink(missing_ok=True)
    store = Store(str(db))
    t0 = time.perf_counter()
    for r in range(runs):
        rid = f"2026113{r % 10}-bench-{r:02d}"
        gpu = ("NVIDIA H200", "NVIDIA H100 80GB HBM3")[r % 2]
        info = {"device": {"kind": "cuda", "name": gpu, "driver": "580.65"}, "driver": "580.65"}
        planned = [Row.from_json(_row(i, r, n_samples)) for i in range(rows)]
        store.begin_run(rid, f"2026-11-30T{r:02d}:00:00+00:00", "bench", "torch", "cuda", info, planned)
        store.finish_run(rid, f"2026-11-30T{r:02d}:30:00+00:00")
    store.close()
    stamp.write_text(json.dumps(want))
    print(f"made {db} ({db.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.0f} s")
    return [r["id"] for r in Store(str(db), create=False).list_runs()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench_run_page(db: Path, run_id: str, chromium: str, static_page: Path) -> dict[str, float]:
    """Seconds from navigation to a rendered table, and for one filter after it, served and from disk."""
    import uvicorn
    from playwright.sync_api import sync_playwright

    from operatorx.web import Queries
    from operatorx.web.app import create_app

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(Queries.open(str(db))), host="127.0.0.1", port=port,
                                           log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    out: dict[str, float] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        for name, url in (("served_cold", f"http://127.0.0.1:{port}/run/{run_id}"),
                          ("served_warm", f"http://127.0.0.1:{port}/run/{run_id}"),
                          ("file", static_page.as_uri())):
            t0 = time.perf_counter()
            page.goto(url)
            page.wait_for_selector("#rows-table tbody tr")
            out[f"{name}_table_s"] = time.perf_counter() - t0
            t1 = time.perf_counter()
            page.select_option("#f-status", "error")
            page.wait_for_function("document.querySelector('#count').textContent.startsWith("
                                   "String(document.querySelectorAll('#rows-table tbody tr').length))")
            page.click("#rows-table th[data-key='tflops']")
            page.wait_for_function("location.search.includes('sort=-tflops')")
            out[f"{name}_filter_sort_s"] = time.perf_counter() - t1
            out[f"{name}_interactive_s"] = time.perf_counter() - t0
            page.goto("about:blank")
        browser.close()
    server.should_exit = True
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--samples", type=int, default=500)
    ap.add_argument("--db", type=Path, default=Path(tempfile.gettempdir()) / "ox_web_bench.db")
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = ap.parse_args()
    ids = make_db(args.db, args.runs, args.rows, args.samples)
    site = Path(tempfile.mkdtemp(prefix="ox_web_site_")) / "site"
    builds: dict[str, float] = {}
    for name, extra in (("report_build_no_compare_s", ["--compare", "none"]), ("report_build_default_s", [])):
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "operatorx", "report", "build", "--db", str(args.db), "-o",
                               str(site), *extra], capture_output=True, text=True)
        builds[name] = round(time.perf_counter() - t0, 2)
        if done.returncode != 0:
            sys.exit(done.stderr)
        print(name, builds[name], done.stdout.strip(), flush=True)
    size_mb = sum(p.stat().st_size for p in site.rglob("*") if p.is_file()) / 1e6
    run_page = site / f"run-{ids[0]}.html"
    page = bench_run_page(args.db, ids[0], args.chromium, run_page)
    from importlib.metadata import version

    chromium_version = subprocess.run([args.chromium, "--version"], capture_output=True, text=True).stdout.strip()
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
              "versions": {p: version(p) for p in ("operatorx", "starlette", "uvicorn", "jinja2", "playwright")}
              | {"chromium": chromium_version},
              "runs": args.runs, "rows_per_run": args.rows, "samples_per_row": args.samples,
              "db_mb": round(args.db.stat().st_size / 1e6), **builds,
              "site_mb": round(size_mb), "run_page_html_mb": round(run_page.stat().st_size / 1e6, 2),
              **{k: round(v, 3) for k, v in page.items()}}
    print(json.dumps(result, indent=1))
    shutil.rmtree(site.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
