#!/usr/bin/env bash
# Device calls of session 13 (the base kit carried, OPERATORX_GIT_SHA set):
#   final     the gpu tests of measure, run, platform, the torch backends and the row model; the accuracy
#             set's two kernels passes, a second process and the reference, each with its launch-gap
#             level (bench/timing_accuracy.py); the first 1,000 gemm cases on GPU 0, with each worker's
#             launch-gap level from the run record
#   levels    N fresh processes (PROBE_RUNS, default 6): the launch-gap probe and fp8_0/fp8_15 kernel by
#             kernel (bench/gap_stream_probe.py), to see the probe's reading beside the calls' own gaps
#   cupti_first  (not run yet: the lead of benchmarks §21) on one machine, bench processes with CUPTI
#             started after CUDA's context (plain) and before it (--cupti-first, as a worker does), then
#             two sweep workers on gemm_fp8: does starting CUPTI first raise the launch gap?
set -uo pipefail
export PYTHONUNBUFFERED=1
. bench/device_kit.sh
case "${1:-final}" in
  final)
    gpu_tests
    echo "== accuracy"
    ACC_PASSES=kernels_1,kernels_2 SKIP_TESTS=1 SKIP_NCU=1 timeout 300 bash bench/h200_timing.sh 2>&1 | \
      grep -v "^cupti \|^pass kernels" | tail -80
    echo "== sweep"
    timeout 200 python3 bench/sweep_scaling.py --testlist gemm --limit 1000 --gpus 0 --db /tmp/final.db \
      --json "$OUT/speed.json" --cases-csv "$OUT/cases.csv" 2>&1 | grep -v "^    \|^  span (timed\|^  busy (timed" | tail -25
    python3 - <<'PY'
import sqlite3, json
con = sqlite3.connect("/tmp/final.db")
for (info,) in con.execute("select info from ox_runs order by started_at desc limit 1"):
    for slot, w in (json.loads(info).get("workers") or {}).items():
        print("worker", slot, "launch_gap", w.get("launch_gap"), "startup launch_gap lap", (w.get("startup_s") or {}).get("launch_gap"))
PY
    cp /tmp/final.db "$OUT/final.db" 2>/dev/null ;;
  cupti_first)
    for v in "" --cupti-first "" --cupti-first "" --cupti-first; do
      echo "== ${v:-plain}"
      timeout 60 python3 bench/gap_stream_probe.py --cases fp8_0,fp8_15 --plan g,d $v 2>&1 | grep -v Warn | \
        sed 's/kernels .*offsets/offsets/' | cut -c1-150
    done
    for i in 1 2; do
      timeout 90 python3 -m operatorx run -t gemm_fp8 --gpus 0 --db /tmp/cf$i.db --results-dir /tmp/cfr > /dev/null 2>&1
    done
    python3 bench/launch_gap_check.py /tmp/cf1.db /tmp/cf2.db ;;
  levels)
    for i in $(seq "${PROBE_RUNS:-6}"); do
      echo "== process $i"
      timeout 100 python3 bench/gap_stream_probe.py --cases fp8_0,fp8_15 --plan g,d,g 2>&1 | grep -v Warn | \
        sed 's/kernels .*offsets/offsets/' | cut -c1-150
    done ;;
esac
