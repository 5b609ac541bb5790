"""Shared by bench/db_*.py: synthetic result rows shaped like real ones, and a throwaway PostgreSQL
database (created with a random name, dropped after)."""

from __future__ import annotations

import random
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from operatorx.spec import Case

SAMPLES_PER_ROW = 200


def row_json(i: int, run_seed: int = 0, backend: str = "torch") -> dict[str, Any]:
    """A realistic `ok` row: 200 raw samples, summary, telemetry, a kernel profile, rates, check."""
    rnd = random.Random(run_seed * 1_000_003 + i)
    m, n, k = 1 + i % 4096, 256 * (1 + i % 57), 256 * (1 + (i // 57) % 29)
    case = Case.model_validate({"type": "gemm", "sources": [f"org/model-{i % 13}/layers.{i % 61}.q_proj"],
                                "args": {"m": m, "n": n, "k": k, "a": {"dtype": "bf16"}, "b": {"dtype": "bf16"},
                                         "out": "bf16"}})
    lat = 5.0 + rnd.random() * 100
    samples = [round(lat * (1 + rnd.gauss(0, 0.01)), 4) for _ in range(SAMPLES_PER_ROW)]
    flops = 2 * m * n * k
    metrics = {
        "latency_us": lat, "busy_us": lat * 0.97, "method": "cupti_kernels", "clock": "device",
        "l2_state": "cold_clean", "l2_verified": True, "samples_us": samples,
        "summary_us": {"median": lat, "mean": lat, "min": min(samples), "max": max(samples), "p10": lat * 0.99,
                       "p90": lat * 1.01, "iqr": lat * 0.01, "std": lat * 0.01, "n": len(samples), "cv": 0.01},
        "noise": 0.004, "stop_reason": "noise_target", "scheme": "bf16",
        "flops": flops, "min_bytes": 2 * (m * k + n * k + m * n), "tflops": flops / lat / 1e6,
        "gbps": 2 * (m * k + n * k + m * n) / lat / 1e3, "pct_peak": 41.0,
        "telemetry": {"sm_clock_mhz": {"min": 1980, "p50": 1980, "max": 1980}, "power_w": {"min": 300, "p50": 320,
                      "max": 350}, "capped": False, "readings": 40},
        "profile": {"kernels": [{"name": "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT", "count_per_call": 1,
                                 "device_us_median": lat * 0.97, "grid": [132, 1, 1], "block": [384, 1, 1]}],
                    "span_us_median": lat, "busy_us_median": lat * 0.97},
        "check": {"rel_error": 0.002, "bound": 0.02, "rows_checked": 64, "reference": "fp32", "checked": True},
    }
    return {"op": {"type": "gemm", "args": case.args_dict(), "backend": backend, "sources": list(case.sources)},
            "label": case.label(), "status": "ok", "testlist": "bench", "case_index": i, "side": "",
            "error_kind": None, "metrics": metrics}


def document(run_id: str, n_rows: int, run_seed: int = 0, started_at: str = "2026-11-30T00:00:00") -> dict[str, Any]:
    return {"schema_version": "1",
            "run": {"id": run_id, "started_at": started_at, "finished_at": started_at, "state": "finished",
                    "testlist": "bench", "backend": "torch", "run_group": None, "shard": None,
                    "host": "bench-host", "device": {"kind": "cuda", "name": "NVIDIA H200", "uuid": "GPU-0"},
                    "driver": "580.65", "software": {"torch": "2.13.0", "operatorx": "0.1.0"},
                    "git_sha": "0" * 40, "device_kind": "cuda"},
            "rows": [row_json(i, run_seed) for i in range(n_rows)]}


@contextmanager
def pg_database(admin_url: str) -> Iterator[str]:
    """A fresh database on the server `admin_url` points at, dropped afterwards. Yields its URL."""
    import psycopg

    name = f"ox_bench_{secrets.token_hex(5)}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin_url.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def versions() -> dict[str, str]:
    import platform
    import sqlite3

    import psycopg
    import sqlalchemy

    out = {"python": platform.python_version(), "sqlalchemy": sqlalchemy.__version__, "psycopg": psycopg.__version__,
           "sqlite": sqlite3.sqlite_version}
    try:
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", connect_timeout=5) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            out["postgresql"] = str(row[0]) if row else "?"
    except Exception:
        pass
    return out
