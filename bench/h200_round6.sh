#!/usr/bin/env bash
# Device calls of session 6 (issues 11, 14, 15; session 5's were the same modes under h200_round5.sh, kept in
# its commits), with the base kit (pydantic, SQLAlchemy, alembic,
# cupti-python) and, for `vllm`, the vllm kit carried (../shared/device/README.md):
#   speed    per-batch cost of each activity source (CUPTI recording launches only / every API call /
#            Kineto), the gpu tests outside tests/backends/vllm, then the first $LIMIT (1000) gemm cases
#            on GPU 0 end to end, with where the time went (bench/sweep_scaling.py)
#   scaling  (nvidia-h200-x2) the first $LIMIT gemm cases on GPU 0 and on GPUs 0,1
#   vllm     every gpu test, and the vLLM MoE release test with its output
#   moe      all of moe_small through vLLM (every GPU)
#   accuracy bench/timing_accuracy.py twice back to back (bench/h200_timing.sh; ACC_PASSES=kernels_1,kernels_2
#            for the accuracy and run-to-run passes only)
#   final    (nvidia-h200-x2) the gpu tests of measure, run, platform and the torch backends, then scaling
#   gpu      every gpu test (tests/web needs the web stack, absent there)
set -uo pipefail
export PYTHONUNBUFFERED=1
. bench/device_kit.sh
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv
case "${1:-speed}" in
  speed)
    if [ -z "${SKIP_COST:-}" ]; then
      echo "== activity cost"; timeout 150 python3 bench/activity_cost.py 2>&1 | tail -4
    fi
    echo "== gpu tests (${TESTS:-all but the vLLM ones})"
    timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider --ignore=tests/web --ignore=tests/backends/vllm \
      ${TESTS:-tests} > "$OUT/tests.txt" 2>&1
    grep -E "passed|failed|FAILED|ERROR|XPASS" "$OUT/tests.txt" | tail -15
    echo "== sweep"
    timeout 300 python3 bench/sweep_scaling.py --testlist gemm --limit "${LIMIT:-1000}" --gpus 0 \
      --db /tmp/speed.db --json "$OUT/speed.json" --cases-csv "$OUT/cases.csv" 2>&1 | tail -30
    cp /tmp/speed.db "$OUT/speed.db" 2>/dev/null
    if [ -n "${PROFILE:-}" ]; then
      echo "== profile of a worker's loop (first 400 gemm cases up to 500 GFLOP)"
      timeout 150 python3 bench/profile_run.py gemm 400 500 > "$OUT/profile.txt" 2>&1
      head -45 "$OUT/profile.txt" | cut -c1-150
    fi ;;
  scaling)
    timeout 120 python3 -m operatorx run -t gemm_perf --limit 2 --gpus 0,1 --db /tmp/warm.db \
      --results-dir /tmp/warm-res > "$OUT/warm.txt" 2>&1
    timeout 500 python3 bench/sweep_scaling.py --testlist gemm --limit "${LIMIT:-1000}" --gpus 0 --gpus 0,1 \
      --db /tmp/scaling.db --json "$OUT/scaling.json" --cases-csv "$OUT/cases.csv" 2>&1 | tail -40
    cp /tmp/scaling.db "$OUT/scaling.db" ;;
  vllm)
    echo "== every gpu test"
    timeout 400 python3 -m pytest -m gpu -q -p no:cacheprovider --ignore=tests/web tests > "$OUT/tests.txt" 2>&1
    grep -E "passed|failed|FAILED|ERROR|XPASS|xfail" "$OUT/tests.txt" | tail -15
    echo "== vLLM MoE memory back on release, with what each case left"
    timeout 120 python3 -m pytest -q -s -p no:cacheprovider --runxfail \
      "tests/backends/vllm/test_gpu.py::test_moe_gives_its_memory_back_over_20_cases" > "$OUT/release.txt" 2>&1
    grep -v "Warning\|warn" "$OUT/release.txt" | tail -12 ;;
  moe)
    echo "== moe_small through vLLM"
    timeout 540 python3 -m operatorx run -t moe_small --backend vllm --db /tmp/moe.db --results-dir /tmp/moe-res \
      > "$OUT/moe.txt" 2>&1
    tail -3 "$OUT/moe.txt"
    python3 -m operatorx results export latest --db /tmp/moe.db --format csv -o "$OUT/moe_small_vllm.csv"
    cp /tmp/moe.db "$OUT/moe.db" ;;
  final)
    echo "== gpu tests (measure, run, platform, torch backends)"
    timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/measure tests/run tests/platform \
      tests/backends/torch > "$OUT/tests.txt" 2>&1
    grep -E "passed|failed|FAILED|ERROR|XPASS" "$OUT/tests.txt" | tail -15
    if [ -n "${PROFILE:-}" ]; then
      echo "== profile of a worker's loop (first 400 gemm cases up to 500 GFLOP)"
      timeout 150 python3 bench/profile_run.py gemm 400 500 > "$OUT/profile.txt" 2>&1
      head -60 "$OUT/profile.txt" | cut -c1-160
    fi
    bash "$0" scaling ;;
  accuracy)
    SKIP_TESTS=1 SKIP_NCU=1 timeout 560 bash bench/h200_timing.sh 2>&1 | tail -75 ;;
  gpu)
    timeout 560 python3 -m pytest -m gpu -q -p no:cacheprovider --ignore=tests/web tests > "$OUT/tests.txt" 2>&1
    grep -E "passed|failed|FAILED|ERROR|XPASS|xfail" "$OUT/tests.txt" | tail -25 ;;
esac
