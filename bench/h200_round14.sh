#!/usr/bin/env bash
# Device calls of session 14 (benchmarks §22; the base kit carried, OPERATORX_GIT_SHA set):
#   final    gpu tests of measure, run, platform, the torch backends and the row model; one
#            `operatorx run -t gemm_fp8` and the first 1,000 gemm cases on GPU 0, with the count of
#            batches that needed CUPTI's forced flush and of records dropped (both 0 on the H200);
#            ACC=1 adds the accuracy set against its reference first (bench/h200_timing.sh)
#   events   ROUNDS (default 5) rounds of fresh processes with no CUPTI, CUPTI after the context and
#            CUPTI first, timed with CUDA events only (bench/gap_events_probe.py)
#   toggle   six processes, CUPTI's recording on and paused in turn in each (--toggle 2)
#   flush    CUPTI's host cost per call and the first launch after a flush, by flag and buffer size
#            (bench/cupti_cost_probe.py, with and without --flush-study)
set -uo pipefail
export PYTHONUNBUFFERED=1
. bench/device_kit.sh
count_flushes() {
  python3 - "$@" <<'PY'
import collections, json, sqlite3, sys
for db in sys.argv[1:]:
    con, forced, batches, dropped, n = sqlite3.connect(db), collections.Counter(), 0, 0, 0
    for (rec,) in con.execute("select record from ox_rows where status='ok'"):
        t = json.loads(rec)["metrics"]["timing"]
        n += 1
        forced[t.get("activity_forced_flushes")] += 1
        batches += t.get("batches") or 0
        dropped += t.get("activity_records_dropped") or 0
    print(f"{db}: {n} ok rows; forced flushes per row {dict(forced)}; batches {batches}; records dropped {dropped}")
PY
}
case "${1:-final}" in
  final)
    gpu_tests
    if [[ "${ACC:-0}" == 1 ]]; then
      echo "== accuracy"
      ACC_PASSES=kernels_1,kernels_2 SKIP_TESTS=1 SKIP_NCU=1 timeout 320 bash bench/h200_timing.sh 2>&1 | \
        grep -v "^cupti \|^pass kernels" | tail -70
    fi
    echo "== gemm_fp8"
    timeout 90 python3 -m operatorx run -t gemm_fp8 --gpus 0 --db /tmp/fp8.db --results-dir /tmp/fp8r > /dev/null 2>&1
    echo "== sweep"
    timeout 200 python3 bench/sweep_scaling.py --testlist gemm --limit 1000 --gpus 0 --db /tmp/final.db \
      --json "$OUT/speed.json" --cases-csv "$OUT/cases.csv" 2>&1 | grep -v "^    \|^  span (timed\|^  busy (timed" | tail -12
    count_flushes /tmp/fp8.db /tmp/final.db ;;
  events)
    for r in $(seq "${ROUNDS:-5}"); do
      for m in none after first; do
        timeout 60 python3 bench/gap_events_probe.py --mode $m 2>&1 | grep "^mode"
      done
    done ;;
  toggle)
    for m in after after first after first after; do
      echo "== $m"
      timeout 90 python3 bench/gap_events_probe.py --mode $m --toggle 2 --cases perf0,perf7,fp8_0,fp8_15 2>&1 | grep "^round"
    done ;;
  flush)
    for v in "" --flush-study; do
      echo "== ${v:-per call}"
      timeout 120 python3 bench/cupti_cost_probe.py $v 2>&1 | grep -v Warn | tail -16
    done ;;
esac
