#!/usr/bin/env bash
# Session 10's device calls (nvidia-h200-x2, the base kit carried, OPERATORX_GIT_SHA set):
#   sweep     the gpu tests of measure and run (the host-released wait, the reordered worker start),
#             then the first $LIMIT (1000) gemm cases on GPU 0 and on GPUs 0,1 (h200_round6.sh scaling)
#   final     the gpu tests of measure, run, platform and the torch backends, scaling, and the
#             accuracy set's two kernels passes, a second process and the reference (h200_round6.sh)
#   parent    the parent's time to its first spawn (bench/parent_start.py, no GPU work), then `sweep`
#             (for the lazy imports of d8a865b: what the earlier spawn saves on this host)
set -uo pipefail
export PYTHONUNBUFFERED=1
. bench/device_kit.sh
case "${1:-sweep}" in
  sweep)
    echo "== gpu tests (measure, run)"
    PYTHONPATH=/tmp/site:$PWD/src timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/measure tests/run \
      > "$OUT/tests.txt" 2>&1
    grep -E "passed|failed|FAILED|ERROR|XPASS" "$OUT/tests.txt" | tail -15
    bash bench/h200_round6.sh scaling 2>&1 | grep -v "^    \|^  span\|^  busy" ;;
  parent)
    PYTHONPATH=/tmp/site:$PWD/src python3 bench/parent_start.py --repeats 5 --device cuda 2>&1 | tail -2
    bash "$0" sweep ;;
  final)
    bash bench/h200_round6.sh final 2>&1 | grep -v "^    \|^  span (timed\|^  busy (timed"
    rm -f "$OUT/scaling.db"
    ACC_PASSES=kernels_1,kernels_2 bash bench/h200_round6.sh accuracy ;;
esac
