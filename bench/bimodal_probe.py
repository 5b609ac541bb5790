"""Is a case's bimodal span a property of the call or of how calls follow each other (issue 15)?

    ACC_CASES=perf1 python bench/timing_accuracy.py cupti OUT        # the reference, its own process
    REF_JSON=OUT/cupti.json python bench/bimodal_probe.py perf11 [perf17 ...]

For each case (names as in bench/timing_accuracy.py), OperatorX's timer (kernels mode, cold-clean
L2, one timer as a sweep worker has) with no pause between calls and with pauses of 0.1, 0.5 and
2 ms, then the independent CUPTI reference's samples (one call per window after a 3 ms spin). Per
run: median, p10, p90, the share of samples above the midpoint of p10 and p90 (the slow mode), and
how often a slow sample follows a slow one (near the share: modes mixed at random; near 1: runs of
one mode).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import timing_accuracy as acc  # noqa: E402


def _describe(label: str, samples: list[float]) -> None:
    xs = sorted(samples)
    p10, p90 = xs[len(xs) // 10], xs[(9 * len(xs)) // 10]
    mid = (p10 + p90) / 2
    slow = [x > mid for x in samples]
    share = sum(slow) / len(slow)
    after = [b for a, b in zip(slow, slow[1:], strict=False) if a]
    follow = sum(after) / len(after) if after else float("nan")
    print(f"  {label:22} n {len(xs):5d}  median {statistics.median(xs):8.2f}  p10 {p10:8.2f}  p90 {p90:8.2f}  "
          f"slow share {share:.2f}  slow after slow {follow:.2f}")


def main(names: list[str]) -> None:
    from operatorx.measure import TimingSettings
    from operatorx.measure.device_timer import device_timer
    from operatorx.measure.telemetry import Telemetry

    telemetry = Telemetry.for_torch_device(0)
    settings = TimingSettings(mode="kernels", l2_state="cold_clean")
    timer = device_timer(settings, acc._l2(), telemetry.max_sm_clock_hz())
    chosen: list[tuple[str, Any, Any]] = [op for op in acc.prepared_ops() if op[0] in names]
    for name, case, p in chosen:
        print(f"{name} {case.label()}")
        for pause_s in (0.0, 1e-4, 5e-4, 2e-3):
            m = timer.measure(p.fn, pause_s=pause_s)
            _describe(f"ours, pause {pause_s * 1e3:.1f} ms", m.samples_us)
    reference = Path(os.environ.get("REF_JSON", ""))
    if reference.is_file():         # `timing_accuracy.py cupti` run before, in its own process
        rows = json.loads(reference.read_text())["rows"]
        for name, _case, _p in chosen:
            if name in rows:
                _describe(f"{name} reference", rows[name]["samples_us"])


if __name__ == "__main__":
    main(sys.argv[1:])
