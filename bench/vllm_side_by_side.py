"""vllm vs torch on the H200: gemm_perf, gemm_fp8, and the DeepSeek-R1-like / Qwen-like MoE layers of
moe_small at tokens 1..2048. Prints one table per testlist; writes JSON under $OUT when set.

    PYTHONPATH=src:$PYTHONPATH python3 bench/vllm_side_by_side.py [--quick]

--quick: first 4 cases of each list (a fast end-to-end look). Other arguments keep only the runs
whose testlist or filter contains them, e.g. `gemm_fp8` or `DeepSeek` (one device call each).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import operatorx.backends.vllm  # noqa: F401  (registers "vllm" until the registry loads it)
from operatorx.run import RunConfig, run_testlist

RUNS: list[tuple[str, Optional[str]]] = [
    ("gemm_perf", None),
    ("gemm_fp8", None),
    ("moe_small", "deepseek-ai/DeepSeek-R1-0528/"),
    ("moe_small", "Qwen/Qwen3-30B-A3B"),
    ("moe_small", "Qwen/Qwen3.5-35B-A3B"),
]
BACKENDS = ("torch", "vllm")


def _kernels(row: Any, n: int = 2) -> str:
    ks = sorted(row.metrics.get("kernels") or [], key=lambda k: -k.get("device_us_per_call", 0.0))
    if not ks:   # a graph replay the profiler did not break down: the eager call's kernels
        return "eager: " + "; ".join(n_[:60] for n_ in (row.metrics.get("backend_meta") or {}).get("eager_kernels", []))
    return "; ".join(k["name"][:60] for k in ks[:n])


def _cell(row: Any) -> str:
    if row is None:
        return "-"
    if row.status != "ok":
        return f"{row.status}: {(row.message or '')[:70]}"
    graph = " G" if (row.metrics.get("backend_meta") or {}).get("cuda_graph") else ""
    return f"{row.metrics['latency_us']:.1f} us{graph}"


def main() -> None:
    quick = "--quick" in sys.argv
    only = [a for a in sys.argv[1:] if not a.startswith("--")]
    runs = [(t, f) for t, f in RUNS if not only or any(o in t or o in (f or "") for o in only)]
    out_dir = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="vllm-sbs-"))
    db = str(out_dir / "side_by_side.db")
    report: list[dict[str, Any]] = []
    for testlist, text in runs:
        rows: dict[str, dict[int, Any]] = {}
        for backend in BACKENDS:
            # result documents go to a temp dir: the database holds every row, and $OUT stays small
            cfg = RunConfig(testlist=testlist, backend=backend, filter=text, limit=4 if quick else None, db=db,
                            results_dir=Path(tempfile.mkdtemp(prefix="sbs-docs-")))
            outcome = run_testlist(cfg)
            rows[backend] = {r.case_index: r for r in outcome.rows}
        title = f"{testlist}" + (f" [{text}]" if text else "")
        print(f"\n## {title}\n")
        print("| case | scheme | torch | vllm | vllm/torch | vllm kernels | vllm selected |")
        print("|---|---|---|---|---|---|---|")
        for idx in sorted(set(rows["torch"]) | set(rows["vllm"])):
            t, v = rows["torch"].get(idx), rows["vllm"].get(idx)
            case = (v or t).case
            ratio = ""
            if t is not None and v is not None and t.status == v.status == "ok":
                ratio = f"{v.metrics['latency_us'] / t.metrics['latency_us']:.2f}"
            meta = (v.metrics.get("backend_meta") or {}) if v is not None else {}
            selected = meta.get("kernel") or (meta.get("experts") or {}).get("fused_experts") or ""
            print(f"| {case.label()} {case.sources[0] if case.sources else ''} | {case.scheme()} | {_cell(t)} | "
                  f"{_cell(v)} | {ratio} | {_kernels(v) if v is not None and v.status == 'ok' else ''} | "
                  f"{selected} |")
            report.append({"testlist": testlist, "filter": text, "case_index": idx, "case": case.to_json(),
                           **{b: (None if r is None else {"status": r.status, "message": r.message,
                                                          "latency_us": r.metrics.get("latency_us"),
                                                          "kernels": r.metrics.get("kernels"),
                                                          "check": r.metrics.get("check"),
                                                          "backend_meta": r.metrics.get("backend_meta")})
                              for b, r in (("torch", t), ("vllm", v))}})
    (out_dir / "vllm_side_by_side.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"\nJSON: {out_dir / 'vllm_side_by_side.json'}")


if __name__ == "__main__":
    main()
