"""Chosen cases of the accuracy set, pass by pass, from one or more `timing_accuracy.py ours` outputs:
latency, busy time, the SM and memory clocks, power and the kernels, to see what differs in a pass
that reads slow (perf8 read 7% slow in the first pass of a fresh process and not in the second).

    python bench/pass_probe.py perf7,perf8 OUT/ours.json [OUT2/ours.json ...]
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    names = sys.argv[1].split(",")
    for path in sys.argv[2:]:
        passes = json.load(open(path))["passes"]
        for key, p in passes.items():
            for name in names:
                r = p["rows"].get(name)
                if not r or "error" in r:
                    print(path, key, name, r)
                    continue
                t = r.get("telemetry") or {}
                p50 = {q: (t.get(q) or {}).get("p50") for q in ("sm_clock_mhz", "mem_clock_mhz", "power_w",
                                                               "temperature_c")}
                print(f"{path} {key} {name} {r['latency_us']:.2f} busy {r['busy_us']:.2f} n {r['n']} "
                      f"readings {t.get('readings')} {p50} reasons {t.get('reasons')} kernels {r.get('kernels')}")


if __name__ == "__main__":
    main()
