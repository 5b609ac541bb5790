"""Rows for the report tests, built through the typed model (the document form is `.to_json()`)."""

from __future__ import annotations

from typing import Any, Optional

from operatorx.result import Row
from operatorx.spec import Case

GEMM = Case.model_validate({"type": "gemm", "args": {"m": 1, "n": 2, "k": 3, "a": {"dtype": "bf16"},
                                                     "b": {"dtype": "bf16"}, "out": "bf16"}})


def make_row(status: str = "ok", message: Optional[str] = None, case: Case = GEMM, index: int = 0,
             side: str = "", error_kind: Optional[str] = None, **metrics: Any) -> Row:
    """A valid row of `status` (Row's status rules): an ok row has a measurement, an error row a kind
    (`exception` unless given) and a message, an unsupported row its reason."""
    if status == "ok":
        metrics = {"latency_us": 10.0, "samples_us": [10.0], "clock": "device", **metrics}
    if status == "error":
        error_kind = error_kind or "exception"
        message = message or "RuntimeError: planted"
    if status == "unsupported":
        message = message or "planted: no kernel for this case"
    return Row(case=case, backend="torch", status=status, testlist="t", case_index=index, message=message,
               side=side, error_kind=error_kind, metrics={"scheme": "bf16", **metrics})


# A tp2 GEMM over two H200s, as run/ranks/rank_runner.py writes it: per-rank samples, the row's samples
# their maximum per iteration, rank 1 capped (so the row is), each rank's busy and collective time.
RANK_SAMPLES_US = ([41.2, 40.9, 41.5, 41.0, 41.3], [43.0, 42.1, 44.2, 42.8, 43.5])
RANK_BUSY_US, RANK_COLLECTIVE_US = (38.6, 40.25), (6.1, 7.45)
RANK_KERNEL_TIMES = "recorded: each rank's own kernel records"
TP2 = Case.model_validate({"type": "gemm", "sources": ["deepseek-ai/DeepSeek-V3/mlp.down_proj"],
                           "args": {"m": 64, "n": 7168, "k": 2048, "a": {"dtype": "bf16"}, "b": {"dtype": "bf16"},
                                    "out": "bf16", "parallel": {"tp": 2}}})


def _rank_telemetry(sm_p50: float, capped: bool) -> dict[str, Any]:
    return {"available": True, "capped": capped, "capping_reasons": ["sw_power_cap"] if capped else [],
            "readings": 12, "sm_clock_mhz": {"min": sm_p50 - 15, "p50": sm_p50, "max": 1980},
            "power_w": {"min": 402.0, "p50": 455.5, "max": 498.0},
            "temperature_c": {"min": 41.0, "p50": 43.0, "max": 44.0}}


def ranked_row(index: int = 0) -> Row:
    """A world=2 row (`metrics.ranks`) whose numbers are what its per-rank samples say."""
    import statistics

    columns = list(zip(*RANK_SAMPLES_US, strict=True))
    samples = [max(c) for c in columns]
    latency_us, flops = statistics.median(samples), 2 * 64 * 7168 * 2048
    telemetry = [_rank_telemetry(1980.0, False), _rank_telemetry(1755.0, True)]
    per_rank = [{"rank": r, "gpu": str(r + 2), "worker": f"gpu{r + 2}", "latency_us": statistics.median(s),
                 "samples_us": list(s), "busy_us": RANK_BUSY_US[r], "collective_us": RANK_COLLECTIVE_US[r],
                 "capped": r == 1, "telemetry": telemetry[r]} for r, s in enumerate(RANK_SAMPLES_US)]
    ranks = {"world": 2, "split": "tp2", "latency_us_min": statistics.median(min(c) for c in columns),
             "skew_us": statistics.median(max(c) - min(c) for c in columns), "iterations": len(columns),
             "capped_ranks": [1], "barrier": "device all_reduce of one element, no host sync",
             "kernel_times": RANK_KERNEL_TIMES, "collectives": ["all_reduce (nccl)"], "per_rank": per_rank}
    return Row.model_validate({
        "case": TP2, "backend": "torch", "status": "ok", "testlist": "t", "case_index": index,
        "metrics": {"scheme": "bf16", "latency_us": latency_us, "samples_us": samples, "clock": "device",
                    "method": "cuda_events", "capped": True, "telemetry": telemetry[0], "flops": flops,
                    "tflops": flops / latency_us / 1e6, "ranks": ranks}})


def store_ranked_run(db: str, run_id: str = "ranks-run") -> list[Row]:
    """A finished run in the store at `db`: `ranked_row` (case 0), a single-rank ok row and an
    unsupported one; returns the rows as stored."""
    from operatorx.store import Store

    other = Case.model_validate({"type": "gemm", "args": {"m": 4, "n": 2, "k": 3, "a": {"dtype": "bf16"},
                                                          "b": {"dtype": "bf16"}, "out": "bf16"}})
    rows = [ranked_row(0), make_row(index=1), make_row("unsupported", case=other, index=2)]
    store = Store(db)
    store.begin_run(run_id, "2026-12-02T00:00:00+00:00", "t", "torch", "cuda", {},
                    [Row.missing(r.case, r.backend, "t", r.case_index) for r in rows])
    for r in rows:
        store.put_row(run_id, r)
    store.finish_run(run_id, "2026-12-02T01:00:00+00:00")
    store.close()
    return rows
