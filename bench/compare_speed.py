"""How long `results compare` takes: compare_documents over N cases of n samples a side (CPU only).

    python bench/compare_speed.py [--cases 1000] [--samples 32 300 2000]

Each case gets lognormal samples (1% spread, a 3% tail of slow calls) on both sides, B 1% slower;
the documents are built through Row.to_json, so parsing them (Row.from_json) is timed too.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from operatorx.report.compare import compare_documents
from operatorx.result import Measured, Row
from operatorx.spec import Case


def _doc(run_id: str, cases: int, n: int, scale: float, rng: np.random.Generator) -> dict:
    rows = []
    for i in range(cases):
        case = Case.model_validate({"type": "gemm", "args": {"m": i + 1, "n": 4096, "k": 4096, "a": {"dtype": "bf16"},
                                                             "b": {"dtype": "bf16"}, "out": "bf16"}})
        x = 20.0 * scale * np.exp(rng.normal(0, 0.01, n))
        x[rng.random(n) < 0.03] *= 1.3
        samples = [float(v) for v in x]
        rows.append(Row(case=case, backend="torch", status="ok", testlist="bench", case_index=i,
                        measured=Measured(latency_us=float(np.median(x)), samples_us=samples)).to_json())
    return {"run": {"id": run_id}, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--samples", type=int, nargs="+", default=[32, 300, 2000])
    args = ap.parse_args()
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.processor() or platform.machine()}")
    for n in args.samples:
        rng = np.random.default_rng(0)
        a, b = _doc("A", args.cases, n, 1.0, rng), _doc("B", args.cases, n, 1.01, rng)
        t0 = time.perf_counter()
        comp = compare_documents(a, b)
        seconds = time.perf_counter() - t0
        print(f"{args.cases} cases x {n} samples a side: {seconds:.2f} s ({1e3 * seconds / args.cases:.2f} ms a case); "
              f"verdicts {comp.counts()}")


if __name__ == "__main__":
    main()
