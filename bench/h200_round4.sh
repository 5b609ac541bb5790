#!/usr/bin/env bash
# Device calls of session 4 (issues 11, 14, 15) on nvidia-h200-x2, with the base kit (pydantic,
# SQLAlchemy, alembic, cupti-python) and, for `vllm`, the vllm kit carried (../shared/device/README.md):
#   scaling  peaks cached on both GPUs (a 2-case run), then the first 1,000 cases of gemm on GPU 0
#            and on GPUs 0,1: cases/s, where the time went, latency agreement (bench/sweep_scaling.py)
#   vllm     every gpu test (tests/web needs the web stack, absent there), the vLLM MoE release test
#            with its output, and all of moe_small through vLLM on both GPUs
#   backends the gpu tests of tests/backends only (vLLM and torch), printing what each release left
#   moe      all of moe_small through vLLM on both GPUs
set -uo pipefail
export PYTHONUNBUFFERED=1
for kit in base vllm; do
  if [ -d ".device-kit/$kit-1" ] && [ ! -f "/tmp/site/.operatorx-$kit" ]; then
    bash ".device-kit/$kit-1/install.sh" >> "$OUT/install.txt" 2>&1 && touch "/tmp/site/.operatorx-$kit"
  fi
done
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv
case "${1:-scaling}" in
  scaling)
    timeout 120 python3 -m operatorx run -t gemm_perf --limit 2 --gpus 0,1 --db /tmp/warm.db \
      --results-dir /tmp/warm-res > "$OUT/warm.txt" 2>&1
    timeout 520 python3 bench/sweep_scaling.py --testlist gemm --limit "${LIMIT:-1000}" --gpus 0 --gpus 0,1 \
      --db /tmp/scaling.db --json "$OUT/scaling.json" 2>&1 | tail -40
    cp /tmp/scaling.db "$OUT/scaling.db" ;;
  vllm)
    echo "== gpu tests"
    timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider --ignore=tests/web tests > "$OUT/tests.txt" 2>&1
    grep -E "passed|failed|FAILED|ERROR|XPASS|xfail" "$OUT/tests.txt" | tail -25
    echo "== vLLM MoE memory back on release, with what each case left"
    timeout 120 python3 -m pytest -q -s -p no:cacheprovider --runxfail \
      "tests/backends/vllm/test_gpu.py::test_moe_gives_its_memory_back_over_20_cases" > "$OUT/release.txt" 2>&1
    grep -v "Warning\|warn" "$OUT/release.txt" | tail -30
    bash "$0" moe ;;
  backends)
    echo "== gpu tests of tests/backends (vLLM and torch), memory-release tests with their output"
    timeout 300 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/backends > "$OUT/backends.txt" 2>&1
    grep -E "^\{'0 |passed|failed|FAILED|ERROR" "$OUT/backends.txt" | cut -c1-600 | tail -20 ;;
  moe)
    echo "== moe_small through vLLM, both GPUs"
    timeout 420 python3 -m operatorx run -t moe_small --backend vllm --db /tmp/moe.db --results-dir /tmp/moe-res \
      > "$OUT/moe.txt" 2>&1
    tail -3 "$OUT/moe.txt"
    python3 -m operatorx results export latest --db /tmp/moe.db --format csv -o "$OUT/moe_small_vllm.csv"
    cp /tmp/moe.db "$OUT/moe.db" ;;
esac
