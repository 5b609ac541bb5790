#!/usr/bin/env bash
# Issue 7 on the H200, in one device call: gpu tests of measure/, the accuracy benchmark (ours,
# cupti-python reference, ncu), and a throughput run over a gemm list. Needs the base and cupti kits.
set -uo pipefail
bash .device-kit/base-1/install.sh >/dev/null 2>&1
[ -d .device-kit/cupti2-1 ] && bash .device-kit/cupti2-1/install.sh >/dev/null 2>&1   # older sessions: cupti-python is in base now
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
log=$OUT/log.txt
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  ncu --version | tail -1
  if [[ "${SKIP_TESTS:-0}" != 1 ]]; then
    echo "== gpu tests (${TESTS:-tests/measure tests/run})"
    python3 -m pytest -q -m gpu ${TESTS:-tests/measure tests/run} -p no:cacheprovider 2>&1 | tail -25
  fi
  for tl in ${RUN_LISTS:-}; do
    echo "== operatorx run -t $tl ${RUN_ARGS:-}"
    python3 -m operatorx run -t "$tl" ${RUN_ARGS:-} --db "$OUT/lists.db" --results-dir "$OUT/lists" 2>&1 | tail -3
  done
  if [[ "${SKIP_BENCH:-0}" != 1 ]]; then
  echo "== ours"; python3 bench/timing_accuracy.py ours "$OUT" 2>&1 | grep -v Warning
  echo "== ours again, a second process (kernels_1)"; mkdir -p "$OUT/again"
  ACC_PASSES=kernels_1 python3 bench/timing_accuracy.py ours "$OUT/again" 2>&1 | grep -v Warning
  echo "== cupti reference"; python3 bench/timing_accuracy.py cupti "$OUT" 2>&1 | grep -v Warning | tail -3
  fi
  if [[ "${SKIP_NCU:-0}" != 1 && "${SKIP_BENCH:-0}" != 1 ]]; then
    echo "== ncu"
    ncu --clock-control none --cache-control all --nvtx --nvtx-include "regex:ox.acc/" \
        --metrics gpu__time_duration.sum --csv --page raw --log-file "$OUT/ncu.csv" \
        python3 bench/timing_accuracy.py ncu-child >/dev/null 2>"$OUT/ncu.err"; echo "ncu rc $?"; tail -3 "$OUT/ncu.err"
  fi
  [[ "${SKIP_BENCH:-0}" != 1 ]] && { echo "== table"; python3 bench/timing_accuracy.py table "$OUT" "$OUT/ncu.csv"; }
  if [[ -n "${RATE_LIST:-}" ]]; then
    echo "== cases/s over $RATE_LIST (limit ${RATE_LIMIT:-300})"
    /usr/bin/time -f "wall %e s" python3 -m operatorx run -t "$RATE_LIST" --limit "${RATE_LIMIT:-300}" \
        --db "$OUT/rate.db" --results-dir "$OUT/res" 2>&1 | tail -4
  fi
} 2>&1 | tee -a "$log"
if [[ -n "${RATE_LIST:-}${RUN_LISTS:-}" ]]; then
  python3 - $(ls "$OUT"/res/*.json "$OUT"/lists/*.json 2>/dev/null) <<'PY' 2>&1 | tee -a "$OUT/log.txt"
import json, statistics as st, sys
from collections import Counter
for path in sys.argv[1:]:
    doc = json.load(open(path))
    rows = doc["rows"]
    ok = [r for r in rows if r["status"] == "ok"]
    print(path.split("/")[-1], Counter(r["status"] for r in rows), "stop:", Counter(r["metrics"].get("stop_reason") for r in ok))
    for phase in ("prepare_check", "timing", "profile", "total"):
        xs = [r["metrics"]["case_seconds"].get(phase, 0.0) for r in ok]
        print(f"  ok rows {phase:14} median {st.median(xs)*1e3:7.1f} ms  sum {sum(xs):6.1f} s")
    every = sum(r["metrics"]["case_seconds"]["total"] for r in rows)
    print(f"  sustained: {len(rows)} rows / {every:.1f} s of cases = {len(rows) / every:.1f} cases/s "
          f"(ok rows only: {len(ok) / sum(r['metrics']['case_seconds']['total'] for r in ok):.1f}/s)")
    xs = [r["metrics"]["case_seconds"]["total"] for r in rows if r["status"] != "ok"]
    print(f"  not-ok rows total sum {sum(xs):.1f} s; capped rows: {sum(1 for r in ok if r['metrics'].get('capped'))}")
    print("  l2_check:", json.dumps((doc["run"].get("l2_check") or {}).get("probe_us")))
    print("  starved dropped:", sum(r["metrics"]["timing"].get("starved_calls_dropped") or 0 for r in ok),
          "host gaps included:", sum(1 for r in ok if r["metrics"]["timing"].get("host_gaps_included")),
          "retried:", sum(1 for r in ok if len(r["metrics"]["telemetry"].get("attempts", [])) > 1))
PY
fi
